"""Translation between the Responses API's items and the chat pipeline's messages (API process).

A Responses request is served by the chat pipeline (`serving_chat.ChatPlan`: chat template,
tool-call prompt and grammar, `response_format` constraint, tool-call parser), so this module
only maps shapes: input items -> chat messages, a `ResponsesRequest` -> a `ChatCompletionRequest`,
and the chat pipeline's assistant message -> output items, plus the `Response` object and its
usage. Shapes follow the openai SDK's `openai.types.responses` models, which clients parse.

Output items are valid input items, so a stored turn is kept as chat messages built by the same
`input_messages`, and the next turn's prompt starts with exactly the previous prompt and reply:
the radix cache serves that prefix.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from radixgen.errors import InvalidRequestError
from radixgen.generate_output import MetaInfo
from radixgen.json_types import JSONObject
from radixgen.runtime.entrypoints.openai.protocol import ChatCompletionRequest, parse_request
from radixgen.runtime.entrypoints.openai.responses_protocol import ResponsesRequest

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
# keys of a function tool that the chat pipeline uses; other keys are refused by name
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}


def new_item_id(prefix: str) -> str:
    """OpenAI-style ids: `resp_...`, `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _required(item: dict[str, Any], key: str, where: str) -> Any:
    if key not in item or item[key] is None:
        raise InvalidRequestError(f"{where} needs '{key}'", f"{where}.{key}")
    return item[key]


def _text(content: Any, where: str) -> str:
    """A string, or text parts joined by newlines; images, files and audio are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where} must be a string or a list of parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = _TEXT_PARTS.get(kind or "")
        if key is None or not isinstance(part.get(key), str):
            raise InvalidRequestError(
                f"content part type {kind!r} is not supported; only text parts are",
                f"{where}[{j}].type",
            )
        texts.append(part[key])
    return "\n".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input (a string or items) -> chat messages.

    Consecutive `function_call` items join the assistant message before them (one assistant
    turn with its tool calls, as chat templates expect); `reasoning` items are dropped (chat
    templates drop earlier turns' reasoning too)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise InvalidRequestError(
                    f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role"
                )
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": _required(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _required(item, "name", where),
                    "arguments": _required(item, "arguments", where),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _required(item, "call_id", where),
                    "content": _text(_required(item, "output", where), f"{where}.output"),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise InvalidRequestError(
                f"input item type {kind!r} is not supported (message, function_call, "
                "function_call_output and reasoning are)",
                f"{where}.type",
            )
    return out


_RECORD_IDS = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def input_item_records(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input as the items `GET /v1/responses/{id}/input_items` lists: each with an id and a
    status, text content as parts (call `input_messages` first: it validates the items)."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    records = []
    for item in items:
        kind = item.get("type") or "message"
        record = {
            **item,
            "type": kind,
            "id": item.get("id") or new_item_id(_RECORD_IDS[kind]),
            "status": item.get("status") or "completed",
        }
        if kind == "message" and isinstance(item.get("content"), str):
            text = item["content"]
            part = output_text_part(text) if item["role"] == "assistant" else None
            record["content"] = [part or {"type": "input_text", "text": text}]
        if kind == "reasoning":
            record.pop("status")  # optional there, and not ours to invent
        records.append(record)
    return records


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise InvalidRequestError(
            f"tool type {kind!r} is not supported: this server runs function tools only",
            f"tools[{i}].type",
        )
    extra = sorted(set(tool) - _TOOL_KEYS)
    if extra:
        raise InvalidRequestError(
            f"function tool field '{extra[0]}' is not supported", f"tools[{i}].{extra[0]}"
        )
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequestError(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
    )


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise InvalidRequestError("text.format json_schema needs 'schema'", "text.format.schema")
    spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema_}
    if fmt.description is not None:
        spec["description"] = fmt.description
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


_CHAT_TOOL_PATH = re.compile(r"^tools\.(\d+)\.function\.")


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that serves `req`: instructions, then the stored conversation
    (`history`), then the new input."""
    messages = list(history) + input_messages(req.input)
    if not messages:
        raise InvalidRequestError("input is empty", "input")
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "stream": req.stream,
        "tools": [_chat_tool(t, i) for i, t in enumerate(req.tools)] if req.tools else None,
        "tool_choice": _chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req),
        "priority": req.priority,
    }
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    try:
        chat: ChatCompletionRequest = parse_request(
            ChatCompletionRequest, {k: v for k, v in body.items() if v is not None}
        )
        return chat
    except InvalidRequestError as e:  # name the field as the Responses request spells it
        param = e.param or ""
        match = _CHAT_TOOL_PATH.match(param)
        if match:
            param = f"tools[{match.group(1)}].{param[match.end() :]}"
        raise InvalidRequestError(e.message, param or None) from None


def message_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id or new_item_id("msg"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text_part(text)],
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    call_id: str, name: str, arguments: str, status: str = "completed", item_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": item_id or new_item_id("fc"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def reasoning_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id or new_item_id("rs"),
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def output_items(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """The chat pipeline's assistant message -> output items: reasoning, the text (also when
    empty, unless there are calls), then one `function_call` per call."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(message["reasoning_content"], status))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(message.get("content") or "", status))
    for call in calls:
        fn = call["function"]
        items.append(function_call_item(call["id"], fn["name"], fn["arguments"]))
    return items


def usage(meta: MetaInfo, reasoning_tokens: int = 0) -> JSONObject:
    """The Responses usage object from a finished request's meta_info; `cached_tokens` is the
    prompt prefix the radix cache served (always reported here, unlike chat's opt-in)."""
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": meta.get("cached_tokens", 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt + completion,
    }


def status_of(finish: str | None) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details) from chat's finish reason; an aborted reply (the client
    left, or an abort request) is incomplete with no reason OpenAI's enum can name."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "abort":
        return "incomplete", None
    return "completed", None


def response_object(
    response_id: str,
    created_at: int,
    req: ResponsesRequest,
    model: str,
    output: list[dict[str, Any]],
    status: str,
    usage_: dict[str, Any] | None = None,
    incomplete: dict[str, str] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `Response` object; the request's settings are echoed as OpenAI does."""
    text = {"format": {"type": "text"}}
    if req.text is not None and req.text.format is not None:
        text = {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": req.store is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "usage": usage_,
        "user": req.user,
    }
