"""Tool-call formats (`--tool-call-parser`): one class per format, in a registry (API process).

Each parser `scan`s the whole reply so far and says what is content, which calls have begun,
their names (once complete and known) and their arguments so far. The full parse and the
streamed deltas (tool_call_stream.py) both come from `scan`, so they agree by construction:
- JSON formats stream the arguments object as the model writes it (its raw text is the final
  `arguments` string); arguments given as a JSON string are sent whole once complete;
- pythonic calls stream one `"key": value` member per finished keyword argument (the name with
  the first of them).
A reply whose calls do not parse (unknown function, broken syntax) stays plain content.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, TypedDict

from radixgen.json_types import JSONValue
from radixgen.reasoning_parser import partial_tag_len
from radixgen.runtime.entrypoints.openai.text_scan import skip_ws, string_end, value_end

_IDENT = re.compile(r"[A-Za-z_][\w.-]*")


@dataclass
class CallView:
    """One call as far as it was generated."""

    name: str | None  # set once the whole name is generated and is one of the tools
    arguments: str  # JSON text so far; only ever grows
    complete: bool


@dataclass
class Scan:
    content: str  # content before the calls (so far); only ever grows
    calls: list[CallView] = field(default_factory=list)
    started: bool = False  # a call list begins right after `content`
    invalid: bool = False  # what began as a call list is not one (it is content after all)


def _next_list_item(text: str, end: int, out: Scan) -> int | None:
    """After a call in a `[a, b]` list: where the next call starts, or None when the list ends
    here (or the text so far does, or what follows is no list: `out` is marked invalid)."""
    nxt = skip_ws(text, end)
    if nxt >= len(text) or text[nxt] == "]":
        return None
    if text[nxt] != ",":
        out.invalid = True
        return None
    return nxt + 1


class ToolCallFunctionDict(TypedDict):
    name: str
    arguments: str  # the arguments object's JSON text


class ToolCallDict(TypedDict):
    """One call of an assistant message's `tool_calls` (OpenAI's shape)."""

    id: str
    type: str
    function: ToolCallFunctionDict


def new_call(name: str, arguments: str) -> ToolCallDict:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _loads(text: str) -> JSONValue:
    try:
        value: JSONValue = json.loads(text)
        return value
    except ValueError:
        return text


class ToolCallParser(ABC):
    """A tool-call text format: how calls are shown to the model, parsed back and forced."""

    name: ClassVar[str]
    arguments_key: ClassVar[str] = "arguments"
    # what the prompt ends with when a call is forced (tool_choice required / named)
    forced_prefix: ClassVar[str] = ""
    # the format's marker strings: where a tokenizer has them as special tokens, replies are
    # decoded keeping special tokens, or the markers would vanish from the text
    markers: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def scan(self, text: str, names: set[str], final: bool) -> Scan:
        """Content and calls in `text`; final=False holds back what may begin a call."""

    @abstractmethod
    def render_calls(self, calls: list[tuple[str, JSONValue]]) -> str:
        """Earlier calls (name, arguments object) as the model would have written them."""

    def parse(
        self, text: str, names: set[str], max_calls: int | None = None
    ) -> tuple[str | None, list[ToolCallDict]]:
        """(content, calls) of a finished reply; (text, []) when its calls do not parse."""
        s = self.scan(text, names, final=True)
        if not s.started or s.invalid or not s.calls:
            return text, []
        if not all(c.complete and c.name for c in s.calls):
            return text, []
        calls = [new_call(c.name or "", c.arguments) for c in s.calls[:max_calls]]
        return (s.content.rstrip() or None), calls


def scan_json_call(
    text: str, pos: int, names: set[str], arg_keys: tuple[str, ...]
) -> tuple[CallView | None, int | None]:
    """The `{"name": ..., "arguments": {...}}` object at `pos`: (view, end); view None when it is
    not a call of `names`, end None while it is incomplete."""
    i = skip_ws(text, pos)
    if i >= len(text):
        return CallView(None, "", False), None
    if text[i] != "{":
        return None, None
    i += 1
    name: str | None = None
    args, seen_args = "", False
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            break
        if text[i] == "}":
            if name is None:
                return None, None
            return CallView(name, args if seen_args else "{}", True), i + 1
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            return None, None
        key_end = string_end(text, i)
        if key_end is None:
            break
        key = _loads(text[i:key_end])
        colon = skip_ws(text, key_end)
        if colon >= len(text):
            break
        if text[colon] != ":":
            return None, None
        v = skip_ws(text, colon + 1)
        end = value_end(text, v)
        if key == "name":
            if end is None:
                break
            value = _loads(text[v:end])
            if not isinstance(value, str) or value not in names:
                return None, None
            name = value
        elif key in arg_keys:
            seen_args = True
            if v < len(text) and text[v] == "{":
                args = text[v : len(text) if end is None else end]  # streamed as written
                if end is not None and not isinstance(_loads(args), dict):
                    return None, None
            elif end is not None:
                value = _loads(text[v:end])
                if isinstance(value, str):  # arguments given as a JSON string
                    value = _loads(value)
                if not isinstance(value, dict):
                    return None, None
                args = json.dumps(value, ensure_ascii=False)
        if end is None:
            break
        i = end
    return CallView(name, args, False), None


def _json_call(name: str, args: JSONValue, key: str) -> str:
    return json.dumps({"name": name, key: args}, ensure_ascii=False)


class HermesParser(ToolCallParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (Qwen2.5,
    Hermes); the default, also for templates that know nothing of tools."""

    name = "qwen25"
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    forced_prefix = "<tool_call>\n"
    markers = (open_tag, close_tag)

    def scan(self, text: str, names: set[str], final: bool) -> Scan:
        start = text.find(self.open_tag)
        if start == -1:
            hold = 0 if final else partial_tag_len(text, self.open_tag)
            return Scan(text[: len(text) - hold])
        out = Scan(text[:start], started=True)
        pos = start
        while True:
            view, end = scan_json_call(
                text, pos + len(self.open_tag), names, ("arguments", "parameters")
            )
            if view is None:
                out.invalid = True
                return out
            out.calls.append(view)
            if end is None:
                return out
            pos = text.find(self.open_tag, end)
            if pos == -1:
                return out

    def render_calls(self, calls: list[tuple[str, JSONValue]]) -> str:
        return "\n".join(
            f"{self.open_tag}\n{_json_call(n, a, 'arguments')}\n{self.close_tag}" for n, a in calls
        )


class Llama3Parser(ToolCallParser):
    """Llama 3.1-3.3 JSON calls: `{"name": ..., "parameters": {...}}` as the whole reply, or after
    `<|python_tag|>`; several calls are separated by `;`."""

    name = "llama3"
    arguments_key = "parameters"
    tag = "<|python_tag|>"
    markers = (tag,)

    def scan(self, text: str, names: set[str], final: bool) -> Scan:
        tag = text.find(self.tag)
        if tag != -1:
            start, body = tag, tag + len(self.tag)
        elif text.lstrip().startswith("{"):
            start, body = 0, 0
        elif not text.strip() and not final:
            return Scan("")  # the reply may still open with "{"
        else:
            hold = 0 if final else partial_tag_len(text, self.tag)
            return Scan(text[: len(text) - hold])
        out = Scan(text[:start], started=True)
        while True:
            view, end = scan_json_call(text, body, names, ("parameters", "arguments"))
            if view is None:
                out.invalid = True
                return out
            out.calls.append(view)
            if end is None:
                return out
            nxt = skip_ws(text, end)
            if nxt >= len(text) or text[nxt] != ";":
                return out
            body = nxt + 1

    def render_calls(self, calls: list[tuple[str, JSONValue]]) -> str:
        return ";".join(_json_call(n, a, "parameters") for n, a in calls)


class MistralParser(ToolCallParser):
    """`[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (Mistral v0.3 and later)."""

    name = "mistral"
    tag = "[TOOL_CALLS]"
    forced_prefix = "[TOOL_CALLS] "
    markers = (tag,)

    def scan(self, text: str, names: set[str], final: bool) -> Scan:
        start = text.find(self.tag)
        if start == -1:
            hold = 0 if final else partial_tag_len(text, self.tag)
            return Scan(text[: len(text) - hold])
        out = Scan(text[:start], started=True)
        i = skip_ws(text, start + len(self.tag))
        if i >= len(text):
            return out
        is_array = text[i] == "["
        if is_array:
            i += 1
        while True:
            view, end = scan_json_call(text, i, names, ("arguments", "parameters"))
            if view is None:
                out.invalid = True
                return out
            out.calls.append(view)
            if end is None or not is_array:
                return out
            nxt = _next_list_item(text, end, out)
            if nxt is None:
                return out
            i = nxt

    def render_calls(self, calls: list[tuple[str, JSONValue]]) -> str:
        body = ", ".join(_json_call(n, a, "arguments") for n, a in calls)
        return f"{self.tag} [{body}]"


class PythonicParser(ToolCallParser):
    """`[get_weather(city="Paris"), now()]`: Python call syntax with literal keyword arguments
    (Llama 3.2 / Llama 4 pythonic templates)."""

    name = "pythonic"

    def scan(self, text: str, names: set[str], final: bool) -> Scan:
        start = self._list_start(text, names, final)
        if start is None:
            return Scan(text)
        out = Scan(text[:start], started=True)
        i = start + 1
        while True:
            i = skip_ws(text, i)
            ident = _IDENT.match(text, i)
            if ident is None or ident.end() >= len(text):
                out.invalid = final or (ident is None and i < len(text))
                return out
            paren = skip_ws(text, ident.end())
            if paren >= len(text):
                out.invalid = final
                return out
            if text[paren] != "(" or ident.group() not in names:
                out.invalid = True
                return out
            view, end = self._call(text, paren + 1, ident.group())
            if view is None:
                out.invalid = True
                return out
            out.calls.append(view)
            if end is None:
                out.invalid = final
                return out
            nxt = _next_list_item(text, end, out)
            if nxt is None:
                return out
            i = nxt

    @staticmethod
    def _list_start(text: str, names: set[str], final: bool) -> int | None:
        """Index of the first `[` that opens (or, while streaming, may open) a call list."""
        for m in re.finditer(r"\[", text):
            i = skip_ws(text, m.end())
            ident = _IDENT.match(text, i)
            if i >= len(text) or (ident is not None and ident.end() >= len(text)):
                partial = text[i:] if ident is not None else ""
                if not final and any(n.startswith(partial) for n in names):
                    return m.start()
                continue
            if ident is None:
                continue
            paren = skip_ws(text, ident.end())
            if ident.group() in names and (paren >= len(text) or text[paren] == "("):
                return m.start()
        return None

    @staticmethod
    def _call(text: str, pos: int, name: str) -> tuple[CallView | None, int | None]:
        pieces: list[str] = []
        k = pos
        while True:
            k = skip_ws(text, k)
            if k >= len(text):
                break
            if text[k] == ")":
                return CallView(name, "{" + ", ".join(pieces) + "}", True), k + 1
            if text[k] == ",":
                k += 1
                continue
            key = _IDENT.match(text, k)
            if key is None:
                return None, None
            eq = skip_ws(text, key.end())
            if eq >= len(text):
                break
            if text[eq] != "=":
                return None, None
            v = skip_ws(text, eq + 1)
            end = value_end(text, v, python=True)
            if end is None:
                break
            try:
                value = ast.literal_eval(text[v:end].strip())
                pieces.append(f"{json.dumps(key.group())}: {json.dumps(value, ensure_ascii=False)}")
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None, None
            k = end
        # NOTE: named once an argument parses, so `f(1)` is not announced as a call of f
        return CallView(name if pieces else None, "{" + ", ".join(pieces), False), None

    def render_calls(self, calls: list[tuple[str, JSONValue]]) -> str:
        def one(name: str, args: JSONValue) -> str:
            items = args.items() if isinstance(args, dict) else []
            return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in items) + ")"

        return "[" + ", ".join(one(n, a) for n, a in calls) + "]"


TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "qwen25": HermesParser,
    "qwen": HermesParser,
    "hermes": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}
TOOL_CALL_PARSER_NAMES: tuple[str, ...] = tuple(TOOL_CALL_PARSERS)


def create_tool_call_parser(name: str | None, chat_template: str = "") -> ToolCallParser:
    """The parser named by --tool-call-parser; unset: the one the chat template writes (its
    markers are in its source), else the `<tool_call>` format."""
    if name is None:
        if "[TOOL_CALLS]" in chat_template:
            name = "mistral"
        elif "<|python_tag|>" in chat_template:
            name = "llama3"
        else:
            name = "qwen25"
    return TOOL_CALL_PARSERS[name]()
