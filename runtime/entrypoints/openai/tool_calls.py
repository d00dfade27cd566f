"""Tool (function) calling for chat models whose template knows nothing of tools.

The tool definitions are written into the system prompt with a fixed call format,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the reply is parsed back into OpenAI
`tool_calls`. With tool_choice "required" or a named function, the prompt ends with the opening
tag and generation is constrained by a JSON schema built from the tools' parameter schemas, so the
output always parses. Templates that render tools themselves get the tools passed through instead.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from radixgen.errors import InvalidRequestError
from radixgen.runtime.entrypoints.openai.protocol import NamedToolChoice, Tool

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"


def tool_mode(tools: list[Tool] | None, choice: Any) -> str | None:
    """None (no tools in play), "auto", "required" or the forced function's name."""
    if not tools:
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise InvalidRequestError("tool_choice needs tools", "tool_choice")
        return None
    if choice is None or choice == "auto":
        return "auto"
    if choice == "none":
        return None
    if choice == "required":
        return "required"
    names = {t.function.name for t in tools}
    if choice.function.name not in names:
        raise InvalidRequestError(
            f"tool_choice names function '{choice.function.name}', which is not in tools",
            "tool_choice",
        )
    return choice.function.name


def tools_system_prompt(tools: list[Tool], mode: str) -> str:
    specs = "\n".join(
        json.dumps(
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": t.function.parameters or {"type": "object", "properties": {}},
            },
            ensure_ascii=False,
        )
        for t in tools
    )
    if mode == "auto":
        rule = "Call a function when it helps to answer; otherwise answer in plain text."
    elif mode == "required":
        rule = "You must call at least one of these functions."
    else:
        rule = f"You must call the function {mode}."
    return (
        "You can call the functions described below (name, description and JSON schema of the "
        f"arguments):\n<tools>\n{specs}\n</tools>\n{rule}\n"
        "To call a function, write one JSON object per call between the tags, exactly like:\n"
        f'{CALL_OPEN}\n{{"name": "function_name", "arguments": {{"arg": "value"}}}}\n{CALL_CLOSE}'
    )


def call_schema(tools: list[Tool], mode: str) -> dict[str, Any]:
    """JSON schema of one call: a named function, or any of the tools for "required"."""

    def one(t: Tool) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "arguments": t.function.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    if mode == "required":
        options = [one(t) for t in tools]
        return options[0] if len(options) == 1 else {"anyOf": options}
    return one(next(t for t in tools if t.function.name == mode))


def history_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier calls and tool results rewritten into the text format the model was shown."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                f"{CALL_OPEN}\n"
                + json.dumps(
                    {
                        "name": c["function"]["name"],
                        "arguments": _loads(c["function"]["arguments"]),
                    },
                    ensure_ascii=False,
                )
                + f"\n{CALL_CLOSE}"
                for c in m["tool_calls"]
            ]
            text = "\n".join(([m["content"]] if m.get("content") else []) + calls)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            out.append(
                {
                    "role": "user",
                    "content": f"{RESPONSE_OPEN}\n{m.get('content') or ''}\n{RESPONSE_CLOSE}",
                }
            )
        else:
            out.append(m)
    return out


def _loads(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _call(obj: Any, names: set[str]) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


def parse_tool_calls(text: str, tools: list[Tool]) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a reply into (content before the calls, calls); unparsable calls stay text."""
    start = text.find(CALL_OPEN)
    if start == -1:
        return text, []
    names = {t.function.name for t in tools}
    calls: list[dict[str, Any]] = []
    pos = start
    while pos != -1:
        body_start = pos + len(CALL_OPEN)
        end = text.find(CALL_CLOSE, body_start)
        body = text[body_start:] if end == -1 else text[body_start:end]
        call = _call(_loads(body.strip()), names)
        if call is None:
            return text, []
        calls.append(call)
        if end == -1:
            break
        pos = text.find(CALL_OPEN, end + len(CALL_CLOSE))
    content = text[:start].strip()
    return (content or None), calls


def parse_forced_call(text: str, tools: list[Tool]) -> list[dict[str, Any]]:
    """The constrained reply is the JSON of one call (the opening tag was in the prompt)."""
    body = text.strip()
    if body.endswith(CALL_CLOSE):
        body = body[: -len(CALL_CLOSE)]
    try:
        obj, _ = json.JSONDecoder().raw_decode(body.strip())
    except ValueError:
        return []
    call = _call(obj, {t.function.name for t in tools})
    return [call] if call else []


class ToolCallStreamFilter:
    """Streams content up to a tool call; holds back text that may be the start of one."""

    def __init__(self) -> None:
        self.sent = 0
        self.in_call = False

    def content_delta(self, text: str) -> str:
        """New content to stream given the cumulative text so far."""
        if self.in_call:
            return ""
        idx = text.find(CALL_OPEN, max(0, self.sent - len(CALL_OPEN)))
        if idx != -1:
            self.in_call = True
            end = idx
        else:
            end = len(text) - _open_tag_prefix_len(text)
        if end <= self.sent:
            return ""
        out = text[self.sent : end]
        self.sent = end
        return out

    def rest(self, text: str) -> str:
        """At the end, when no call was parsed: whatever was held back."""
        out = text[self.sent :]
        self.sent = len(text)
        return out


def _open_tag_prefix_len(text: str) -> int:
    for k in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(CALL_OPEN[:k]):
            return k
    return 0
