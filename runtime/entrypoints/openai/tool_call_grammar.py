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

from radixgen.runtime.entrypoints.openai.protocol import Tool
from radixgen.runtime.entrypoints.openai.tool_parsers import (
    MistralParser,
    PythonicParser,
    ToolCallParser,
)


def allowed_tools(tools: list[Tool], mode: str) -> list[Tool]:
    """All tools for "required", else the one named."""
    return tools if mode == "required" else [t for t in tools if t.function.name == mode]


def call_schema(tools: list[Tool], mode: str, arguments_key: str = "arguments") -> dict[str, Any]:
    """JSON schema of one call: a named function, or any of the tools for "required"."""

    def one(t: Tool) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                arguments_key: t.function.parameters or {"type": "object"},
            },
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }

    options = [one(t) for t in allowed_tools(tools, mode)]
    return options[0] if len(options) == 1 else {"anyOf": options}


def forced_call_constraint(parser: ToolCallParser, tools: list[Tool], mode: str) -> dict[str, Any]:
    """Sampling params (json_schema or ebnf) that make the reply one call in `parser`'s format;
    the prompt ends with `parser.forced_prefix`."""
    if isinstance(parser, PythonicParser):
        return {"ebnf": pythonic_ebnf(allowed_tools(tools, mode))}
    schema = call_schema(tools, mode, parser.arguments_key)
    if isinstance(parser, MistralParser):
        schema = {"type": "array", "items": schema, "minItems": 1, "maxItems": 1}
    # Llama 3 (`parameters`) and <tool_call> calls are the bare object
    return {"json_schema": schema}


_PY_RULES = r"""
pystr ::= "\"" ([^"\\\n] | "\\" ["\\nt])* "\""
pyint ::= "-"? ("0" | [1-9] [0-9]*)
pynum ::= pyint ("." [0-9]+)?
pybool ::= "True" | "False"
pyany ::= pystr | pynum | pybool | "None" | "[" (pyany (", " pyany)*)? "]" | "{" (pystr ": " pyany (", " pystr ": " pyany)*)? "}"
"""


def _value_rule(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "pyany"
    if schema.get("enum"):
        literals = [_py_literal(v) for v in schema["enum"]]
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


def _py_literal(value: Any) -> str | None:
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
        props = params.get("properties") or {}
        required = [k for k in params.get("required") or [] if k in props]
        optional = [k for k in props if k not in required]
        items = [f"{json.dumps(k + '=')} {_value_rule(props[k])}" for k in required + optional]
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
