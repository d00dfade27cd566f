"""Parse and check constraint specs before a backend sees them, and turn library errors into clear text.

Runs on the grammar compile worker. Every failure raises `GrammarError` whose message starts with
"invalid <kind>: ..." so a client can tell which part of its request was wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixgen.errors import GrammarError
from radixgen.json_types import JSONObject, JSONValue

GRAMMAR_KINDS: tuple[str, ...] = ("json_schema", "regex", "ebnf", "choices", "json_object")

# the schema json_object requests compile to: any JSON object, any keys
ANY_JSON_OBJECT_SCHEMA = '{"type": "object"}'

# xgrammar prefixes its C++ messages with "[hh:mm:ss] /path/file.cc:123: " and sometimes
# "Check failed: (cond) is false: "; clients need neither
_CPP_LOCATION = re.compile(r"\[\d{2}:\d{2}:\d{2}\] \S+:\d+: ")
_CHECK_FAILED = re.compile(r"Check failed: \(.*?\) is false: ")


def invalid(kind: str, why: str) -> GrammarError:
    return GrammarError(f"invalid {kind}: {why}", kind)


def clean_library_message(error: BaseException | str) -> str:
    """A grammar library's error as one readable line, without C++ source locations."""
    text = str(error)
    text = _CPP_LOCATION.sub("", text)
    text = _CHECK_FAILED.sub("", text)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    text = " ".join(lines) or (type(error).__name__ if isinstance(error, BaseException) else "")
    return text if len(text) <= 500 else text[:497] + "..."


def load_json_schema(spec: str) -> JSONObject | bool:
    """The schema as an object; its text must be JSON and its top level an object or a boolean."""
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as e:
        raise invalid("json_schema", f"not valid JSON ({e})") from None
    if not isinstance(schema, (dict, bool)):
        raise invalid("json_schema", f"a schema must be a JSON object, got {type(schema).__name__}")
    return schema


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def subschemas(
    path: str,
    schema: dict[str, Any],
    maps: tuple[str, ...],
    lists: tuple[str, ...],
    values: tuple[str, ...],
) -> list[tuple[str, Any]]:
    """(JSON pointer, subschema) of a schema's children under the given keywords: `maps` hold
    name -> subschema, `lists` subschema lists, `values` one subschema (or a list of them)."""
    children: list[tuple[str, Any]] = []
    for key in maps:
        if isinstance(schema.get(key), dict):
            children.extend((f"{path}/{key}/{name}", sub) for name, sub in schema[key].items())
    for key in lists:
        if isinstance(schema.get(key), list):
            children.extend((f"{path}/{key}/{i}", sub) for i, sub in enumerate(schema[key]))
    for key in values:
        value = schema.get(key)
        if isinstance(value, list):
            children.extend((f"{path}/{key}/{i}", sub) for i, sub in enumerate(value))
        elif isinstance(value, dict):
            children.append((f"{path}/{key}", value))
    return children


def find_unenforceable(
    schema: Any, keywords: tuple[str, ...], path: str = ""
) -> tuple[str, str] | None:
    """(keyword, JSON pointer) of the first keyword a backend would silently ignore.

    `keywords` are the backend's own gaps; pattern together with minLength/maxLength is a gap of
    every regex-based converter here (the length is dropped, or the pattern is).
    """
    if not isinstance(schema, dict):
        return None
    for kw in keywords:
        if kw not in schema or (kw == "uniqueItems" and schema[kw] is False):
            continue
        if kw == "allOf" and isinstance(schema[kw], list) and len(schema[kw]) <= 1:
            continue  # a single subschema (pydantic's $ref wrapper) is just that subschema
        return kw, path or "/"
    if "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
        return "pattern with minLength/maxLength", path or "/"
    for child_path, sub in subschemas(path, schema, _SCHEMA_MAPS, _SCHEMA_LISTS, _SCHEMA_VALUES):
        found = find_unenforceable(sub, keywords, child_path)
        if found is not None:
            return found
    return None


def refuse_unenforceable(backend: str, schema: JSONValue, keywords: tuple[str, ...]) -> None:
    """Raise a 400 naming the first schema keyword `backend` would serve unenforced."""
    found = find_unenforceable(schema, keywords)
    if found is not None:
        keyword, where = found
        others = "llguidance" if backend == "xgrammar" else "xgrammar or llguidance"
        raise GrammarError(
            f"the {backend} grammar backend cannot enforce '{keyword}' (at {where}) in "
            f"json_schema; use --grammar-backend {others}",
            "json_schema",
        )


def load_choices(spec: str) -> list[str]:
    """The choice list from its cache-key form (a JSON list of non-empty strings)."""
    try:
        choices = json.loads(spec)
    except json.JSONDecodeError as e:
        raise invalid("choices", f"not a JSON list ({e})") from None
    if not isinstance(choices, list) or not choices:
        raise invalid("choices", "must be a non-empty list of strings")
    if not all(isinstance(c, str) and c for c in choices):
        raise invalid("choices", "every choice must be a non-empty string")
    return list(dict.fromkeys(choices))  # duplicates add nothing


def choices_to_ebnf(choices: list[str]) -> str:
    """A grammar whose root matches exactly one of the choices (GBNF string literals)."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices)


def choices_to_regex(choices: list[str]) -> str:
    """An alternation of the escaped choices, longest first.

    NOTE: outlines-core's regex engine resolves alternation leftmost-first, so a choice that is a
    prefix of another ("yes" / "yes please") would hide the longer one if listed first.
    """
    ordered = sorted(choices, key=len, reverse=True)
    return "(" + "|".join(re.escape(c) for c in ordered) + ")"


def _ebnf_literal(text: str) -> str:
    # JSON string escapes (\" \\ \n \t \uXXXX) are also valid in GBNF string literals
    return json.dumps(text, ensure_ascii=False)


def utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is complete UTF-8 text (forced bytes may end mid-character)."""
    for cut in range(len(data), max(len(data) - 4, 0) - 1, -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
