"""Grammars that force a tool call in each parser's format (API process).

tool_choice "required" or a named function constrains the reply to exactly one call of the
allowed tools, written in the server's tool-call format, so it always parses: a JSON schema for
the JSON formats, an EBNF grammar for the pythonic one (required keyword arguments in schema
order, then optional ones; strings, numbers, booleans and enums typed, other values any Python
literal).
"""

from __future__ import annotations

import json
from typing import Any

from radixgen.json_types import JSONObject, JSONValue
from radixgen.runtime.entrypoints.openai.protocol import Tool
from radixgen.runtime.entrypoints.openai.tool_parsers import (
    MistralParser,
    PythonicParser,
    ToolCallParser,
)


def allowed_tools(tools: list[Tool], mode: str) -> list[Tool]:
    """All tools for "required", else the one named."""
    return tools if mode == "required" else [t for t in tools if t.function.name == mode]


def call_schema(tools: list[Tool], mode: str, arguments_key: str = "arguments") -> JSONObject:
    """JSON schema of one call: a named function, or any of the tools for "required"."""
    schema, defs = call_schema_at(tools, mode, arguments_key, "")
    return {**schema, "$defs": defs} if defs else schema


def call_schema_at(
    tools: list[Tool], mode: str, arguments_key: str, at: str
) -> tuple[JSONObject, JSONObject]:
    """The call's schema to sit at JSON pointer `at` of the grammar's schema, and the
    definitions its root must hold.

    Each tool's parameters move under `properties.<arguments_key>`, so their local `$ref`s (pydantic writes
    `#/$defs/...` for every nested model or enum) are rewritten to the new place, and their
    `$defs` / `definitions` are lifted to the root's `$defs` (prefixed with the tool's name when
    several tools' definitions could clash)."""
    allowed = allowed_tools(tools, mode)
    defs: JSONObject = {}

    def one(t: Tool, pointer: str) -> JSONObject:
        params: JSONObject = t.function.parameters or {"type": "object"}
        tag = f"{t.function.name}." if len(allowed) > 1 else ""
        arguments = _relocate(params, f"{pointer}/properties/{arguments_key}", tag, defs)
        return {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t.function.name]}, arguments_key: arguments},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }  # fmt: skip

    schema: JSONObject
    if len(allowed) == 1:
        schema = one(allowed[0], at)
    else:
        schema = {"anyOf": [one(t, f"{at}/anyOf/{i}") for i, t in enumerate(allowed)]}
    return schema, defs


_DEFINITION_KEYS = ("$defs", "definitions")
# values that are data, not schemas: a "$ref" key inside them is not a reference
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})


def _relocate(params: JSONObject, at: str, tag: str, defs: JSONObject) -> JSONValue:
    """`params` to sit at pointer `at`: its definitions moved into `defs` (names prefixed with
    `tag`), every local `$ref` rewritten to match."""

    def pointer(ref: str) -> str:
        if not ref.startswith("#"):
            return ref  # a remote or $id-relative reference: left to the grammar backend
        path = ref[1:]
        for key in _DEFINITION_KEYS:
            head = f"/{key}/"
            if path.startswith(head):
                name, _, rest = path[len(head) :].partition("/")
                moved = _escape(tag + _unescape(name))
                return f"#/$defs/{moved}" + (f"/{rest}" if rest else "")
        return f"#{at}{path}"

    def walk(node: JSONValue) -> JSONValue:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out: JSONObject = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out[key] = pointer(value)
            elif key in _DATA_KEYS:
                out[key] = value
            else:
                out[key] = walk(value)
        return out

    body = dict(params)
    for key in _DEFINITION_KEYS:
        # Any: a definitions keyword's value is read as the object it must be (as before, one
        # that is not fails here)
        found: Any = body.pop(key, None) or {}
        for name, schema in found.items():
            defs[tag + name] = walk(schema)
    return walk(body)


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def forced_call_constraint(parser: ToolCallParser, tools: list[Tool], mode: str) -> JSONObject:
    """Sampling params (json_schema or ebnf) that make the reply one call in `parser`'s format;
    the prompt ends with `parser.forced_prefix`."""
    if isinstance(parser, PythonicParser):
        return {"ebnf": pythonic_ebnf(allowed_tools(tools, mode))}
    if isinstance(parser, MistralParser):
        item, defs = call_schema_at(tools, mode, parser.arguments_key, "/items")
        schema: JSONObject = {"type": "array", "items": item, "minItems": 1, "maxItems": 1}
        if defs:
            schema["$defs"] = defs
    else:
        schema = call_schema(tools, mode, parser.arguments_key)
    # Llama 3 (`parameters`) and <tool_call> calls are the bare object
    return {"json_schema": schema}


_PY_RULES = r"""
pystr ::= "\"" ([^"\\\n] | "\\" ["\\nt])* "\""
pyint ::= "-"? ("0" | [1-9] [0-9]*)
pynum ::= pyint ("." [0-9]+)?
pybool ::= "True" | "False"
pyany ::= pystr | pynum | pybool | "None" | "[" (pyany (", " pyany)*)? "]" | "{" (pystr ": " pyany (", " pystr ": " pyany)*)? "}"
"""


def _value_rule(schema: JSONValue, root: JSONObject) -> str:
    schema = _resolve_local_ref(schema, root)
    if not isinstance(schema, dict):
        return "pyany"
    enum = schema.get("enum")
    if enum:
        # Any: the keyword's value is read as the list it must be (as before)
        values: Any = enum
        literals = [_py_literal(v) for v in values]
        if all(lit is not None for lit in literals):
            return "(" + " | ".join(json.dumps(lit) for lit in literals) + ")"
    kind = schema.get("type")
    return {
        "string": "pystr",
        "integer": "pyint",
        "number": "pynum",
        "boolean": "pybool",
        "null": '"None"',
    }.get(kind if isinstance(kind, str) else "", "pyany")


def _resolve_local_ref(schema: JSONValue, root: JSONObject, hops: int = 8) -> JSONValue:
    """A `{"$ref": "#/..."}` property (pydantic's nested enums) as the schema it points to
    inside the tool's parameters, so its values are typed too; anything else as it is."""
    while hops and isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        assert isinstance(ref, str)  # checked by the loop's condition
        if not ref.startswith("#"):
            return schema
        node: JSONValue = root
        for token in filter(None, ref[1:].split("/")):
            node = node.get(_unescape(token)) if isinstance(node, dict) else None
        if node is None:
            return schema
        schema, hops = node, hops - 1
    return schema


def _py_literal(value: JSONValue) -> str | None:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # also a valid Python string literal
    return None


def pythonic_ebnf(tools: list[Tool]) -> str:
    """`[name(k=v, ...)]` for one call of any of `tools`."""
    rules = []
    for n, tool in enumerate(tools):
        params = tool.function.parameters or {}
        # Any: the parameters' keywords are read as the shapes JSON Schema gives them (as before)
        props: Any = params.get("properties") or {}
        listed: Any = params.get("required") or []
        required = [k for k in listed if k in props]
        optional = [k for k in props if k not in required]
        items = [
            f"{json.dumps(k + '=')} {_value_rule(props[k], params)}" for k in required + optional
        ]
        required_items, optional_items = items[: len(required)], items[len(required) :]
        if required_items:
            body = ' ", " '.join(required_items)
            body += "".join(f' (", " {o})?' for o in optional_items)
        elif optional_items:  # the first optional opens the list, the rest follow it
            body = f"({optional_items[0]}"
            body += "".join(f' (", " {o})?' for o in optional_items[1:]) + ")?"
        else:
            body = ""
        rules.append(f'call{n} ::= {json.dumps(tool.function.name + "(")} {body} ")"')
    root = 'root ::= "[" (' + " | ".join(f"call{n}" for n in range(len(tools))) + ') "]"'
    return "\n".join([root, *rules]) + _PY_RULES
