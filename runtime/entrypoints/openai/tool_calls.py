"""Tool (function) calling for chat models: tool modes, the tools prompt, history rewriting.

The tool definitions are written into the system prompt with the server's call format
(`--tool-call-parser`, tool_parsers.py; default `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`); the reply is parsed back into OpenAI `tool_calls`. With tool_choice "required" or
a named function, the prompt ends with the format's opening and generation is constrained to one
call (tool_call_grammar.py), so the output always parses. Templates that render tools
themselves get the tools passed through instead.

parallel_tool_calls=false: the prompt asks for one call, a forced call is one call by its grammar,
and a reply holding several keeps only the first (the rest is dropped, streamed or not).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from radixgen.errors import InvalidRequestError
from radixgen.json_types import JSONObject, JSONValue
from radixgen.runtime.entrypoints.openai import tool_call_grammar
from radixgen.runtime.entrypoints.openai.protocol import NamedToolChoice, Tool
from radixgen.runtime.entrypoints.openai.tool_parsers import (
    HermesParser,
    ToolCallDict,
    ToolCallParser,
)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"


def tool_mode(
    tools: list[Tool] | None,
    choice: Literal["none", "auto", "required"] | NamedToolChoice | None,
) -> str | None:
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
    name: str = choice.function.name
    return name


def tools_system_prompt(
    tools: list[Tool], mode: str, parser: ToolCallParser | None = None, parallel: bool = True
) -> str:
    parser = parser or HermesParser()
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
    if not parallel:
        rule += " Call at most one function."
    example = parser.render_calls([("function_name", {"arg": "value"})])
    return (
        "You can call the functions described below (name, description and JSON schema of the "
        f"arguments):\n<tools>\n{specs}\n</tools>\n{rule}\n"
        f"To call a function, write the call exactly like:\n{example}"
    )


def call_schema(tools: list[Tool], mode: str) -> JSONObject:
    """JSON schema of one `<tool_call>` call (see tool_call_grammar for the other formats)."""
    return tool_call_grammar.call_schema(tools, mode)


def history_messages(
    messages: list[dict[str, Any]], parser: ToolCallParser | None = None
) -> list[dict[str, Any]]:
    """Earlier calls and tool results rewritten into the text format the model was shown."""
    parser = parser or HermesParser()
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = parser.render_calls(
                [
                    (c["function"]["name"], _loads(c["function"]["arguments"]))
                    for c in m["tool_calls"]
                ]
            )
            text = "\n".join(([m["content"]] if m.get("content") else []) + [calls])
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


def _loads(arguments: str) -> JSONValue:
    try:
        value: JSONValue = json.loads(arguments)
        return value
    except (TypeError, ValueError):
        return arguments


def parse_tool_calls(text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCallDict]]:
    """Split a `<tool_call>` reply into (content before the calls, calls); unparsable calls
    stay text."""
    return HermesParser().parse(text, {t.function.name for t in tools})


def parse_forced_call(text: str, tools: list[Tool]) -> list[ToolCallDict]:
    """The constrained reply is the JSON of one call (the opening tag was in the prompt)."""
    _, calls = HermesParser().parse(CALL_OPEN + text, {t.function.name for t in tools}, 1)
    return calls
