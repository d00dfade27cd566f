"""Constraint cases for end-to-end decoding tests: spec, prompt and an output validator each.

Free strings and arrays carry maxLength / maxItems so that every output of the 135M model can
finish within the token budget; cases that cannot be bounded (any JSON object, recursive EBNF)
are marked `bounded=False` and must then only be valid when they stop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # json_schema | regex | ebnf | choices | json_object
    spec: Any  # dict for json_schema, str for regex/ebnf, list for choices, None for json_object
    prompt: str
    outlines_ok: bool = True  # False: outlines must refuse it (kind or keyword it cannot enforce)
    bounded: bool = True

    def sampling(self) -> dict[str, Any]:
        if self.kind == "json_object":
            return {"json_object": True}
        return {self.kind: self.spec}

    def check(self, text: str) -> None:
        """Raise AssertionError when `text` does not satisfy the constraint."""
        CHECKERS[self.kind](self, text)


def _check_schema(case: Case, text: str) -> None:
    value = json.loads(text)
    jsonschema.validate(value, case.spec)


def _check_regex(case: Case, text: str) -> None:
    assert re.fullmatch(case.spec, text), f"{text!r} does not match {case.spec!r}"


def _check_choice(case: Case, text: str) -> None:
    assert text in case.spec, f"{text!r} is not one of {case.spec}"


def _check_object(case: Case, text: str) -> None:
    assert isinstance(json.loads(text), dict), f"{text!r} is not a JSON object"


def _check_ebnf(case: Case, text: str) -> None:
    EBNF_CHECKERS[case.name](text)


CHECKERS: dict[str, Callable[[Case, str], None]] = {
    "json_schema": _check_schema,
    "regex": _check_regex,
    "choices": _check_choice,
    "json_object": _check_object,
    "ebnf": _check_ebnf,
}

NAME = {"type": "string", "maxLength": 16}
SHORT = {"type": "string", "maxLength": 12}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        **extra,
    }


SCHEMA_CASES = [
    Case(
        "person",
        "json_schema",
        _obj({"name": NAME, "age": {"type": "integer"}}),
        "Give me a JSON person.",
    ),
    Case(
        "person_bounds",
        "json_schema",
        _obj({"name": NAME, "age": {"type": "integer", "minimum": 18, "maximum": 99}}),
        "Describe an adult as JSON.",
        outlines_ok=False,
    ),
    Case(
        "matrix",
        "json_schema",
        _obj(
            {
                "rows": {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                        "minItems": 1,
                        "maxItems": 3,
                    },
                    "minItems": 1,
                    "maxItems": 3,
                }
            }
        ),
        "Give a small matrix of digits as JSON.",
        outlines_ok=False,
    ),
    Case(
        "tags_nested",
        "json_schema",
        _obj(
            {
                "groups": {
                    "type": "array",
                    "items": {"type": "array", "items": SHORT, "maxItems": 2},
                    "maxItems": 2,
                }
            }
        ),
        "Group some words as JSON.",
    ),
    Case(
        "shirt_enum",
        "json_schema",
        _obj(
            {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", "XL"]}}
        ),
        "Pick a shirt as JSON.",
    ),
    Case(
        "weather_numbers",
        "json_schema",
        _obj(
            {
                "temperature": {"type": "number", "minimum": -50, "maximum": 60},
                "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            }
        ),
        "Report the weather as JSON.",
        outlines_ok=False,
    ),
    Case(
        "exclusive_bounds",
        "json_schema",
        _obj({"score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}),
        "Rate a movie as JSON.",
        outlines_ok=False,
    ),
    Case(
        "zip_pattern",
        "json_schema",
        _obj(
            {
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            }
        ),
        "Give a zip code and a product code as JSON.",
    ),
    Case(
        "optional_fields",
        "json_schema",
        _obj({"title": NAME, "subtitle": SHORT, "pages": {"type": "integer"}}, required=["title"]),
        "Describe a book as JSON.",
    ),
    Case(
        "defs_ref",
        "json_schema",
        {
            "$defs": {"address": _obj({"street": NAME, "city": SHORT})},
            **_obj({"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}}),
        },
        "Give home and work addresses as JSON.",
    ),
    Case(
        "any_of",
        "json_schema",
        _obj(
            {
                "id": {"anyOf": [{"type": "integer"}, SHORT]},
                "note": {"anyOf": [SHORT, {"type": "null"}]},
            }
        ),
        "Give an id and a note as JSON.",
    ),
    Case(
        "closed_object",
        "json_schema",
        _obj({"user": NAME, "admin": {"type": "boolean"}}, additionalProperties=False),
        "Describe a user account as JSON.",
    ),
    Case(
        "todo_list",
        "json_schema",
        _obj(
            {
                "todos": {
                    "type": "array",
                    "items": _obj({"id": {"type": "integer"}, "done": {"type": "boolean"}}),
                    "maxItems": 3,
                }
            }
        ),
        "List a few todos as JSON.",
    ),
    Case(
        "flags",
        "json_schema",
        _obj(
            {
                "active": {"type": "boolean"},
                "deleted": {"type": "boolean"},
                "parent": {"type": "null"},
            }
        ),
        "Give the flags of a record as JSON.",
    ),
    Case(
        "const_version",
        "json_schema",
        _obj({"version": {"const": "1.0"}, "name": SHORT}),
        "Describe a release as JSON.",
    ),
    Case(
        "deep_nesting",
        "json_schema",
        _obj({"a": _obj({"b": _obj({"c": SHORT, "n": {"type": "integer"}})})}),
        "Give a nested JSON object.",
    ),
    Case(
        "fruit_list",
        "json_schema",
        _obj(
            {
                "fruits": {
                    "type": "array",
                    "items": {"enum": ["apple", "banana", "cherry"]},
                    "minItems": 1,
                    "maxItems": 3,
                }
            }
        ),
        "List fruits as JSON.",
    ),
    Case(
        "digits_array",
        "json_schema",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": 9},
            "minItems": 2,
            "maxItems": 4,
        },
        "Give a few digits as a JSON array.",
        outlines_ok=False,
    ),
    Case(
        "nullable_type",
        "json_schema",
        _obj(
            {"nickname": {"type": ["string", "null"], "maxLength": 12}, "age": {"type": "integer"}}
        ),
        "Describe a person with an optional nickname as JSON.",
    ),
    Case(
        "book",
        "json_schema",
        _obj(
            {
                "title": NAME,
                "year": {"type": "integer", "minimum": 1500, "maximum": 2025},
                "genres": {
                    "type": "array",
                    "items": {"enum": ["fiction", "history", "science"]},
                    "maxItems": 2,
                },
            }
        ),
        "Describe a book as JSON.",
        outlines_ok=False,
    ),
    Case(
        "product",
        "json_schema",
        _obj(
            {
                "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                "price": {"type": "number"},
                "in_stock": {"type": "boolean"},
            }
        ),
        "Describe a product as JSON.",
    ),
    Case(
        "event",
        "json_schema",
        _obj(
            {
                "event": NAME,
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                "attendees": {"type": "integer"},
            }
        ),
        "Describe an event as JSON.",
    ),
    Case(
        "recipe",
        "json_schema",
        _obj(
            {
                "dish": NAME,
                "ingredients": {
                    "type": "array",
                    "items": _obj({"item": SHORT, "grams": {"type": "integer"}}),
                    "maxItems": 3,
                },
            }
        ),
        "Give a recipe as JSON.",
    ),
    Case(
        "city_weather",
        "json_schema",
        _obj(
            {
                "city": {"enum": ["Paris", "London", "Tokyo"]},
                "highs": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
            }
        ),
        "Give the weather in a city as JSON.",
    ),
]

REGEX_CASES = [
    Case("date", "regex", r"\d{4}-\d{2}-\d{2}", "What is today's date?"),
    Case(
        "ipv4",
        "regex",
        r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
        "Give me an IP address.",
    ),
    Case("us_phone", "regex", r"\(\d{3}\) \d{3}-\d{4}", "Give me a US phone number."),
    Case(
        "intl_phone",
        "regex",
        r"\+\d{1,3} \d{3} \d{3} \d{4}",
        "Give me an international phone number.",
    ),
    Case("clock", "regex", r"([01]\d|2[0-3]):[0-5]\d", "What time is it?"),
    Case("email", "regex", r"[a-z]{1,10}@[a-z]{1,10}\.(com|org|net)", "Give me an email address."),
    Case("hex_color", "regex", r"#[0-9a-fA-F]{6}", "Give me a color code."),
    Case("semver", "regex", r"\d{1,2}\.\d{1,2}\.\d{1,2}", "Give me a version number."),
    Case(
        "answer",
        "regex",
        r"(Yes|No), because [a-z ]{1,30}\.",
        "Is the sky blue? Answer and explain briefly.",
    ),
]

ARITH = """root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= factor (("*" | "/") factor){0,2}
factor ::= num | "(" expr ")"
num ::= [1-9] [0-9]{0,2}
"""
KEY_VALUES = """root ::= pair ("," pair){0,2}
pair ::= key "=" value
key ::= [a-z]{1,8}
value ::= [0-9]{1,4}
"""
GREETING = """root ::= greeting " " name "!"
greeting ::= "Hello" | "Hi" | "Good morning"
name ::= [A-Z] [a-z]{1,10}
"""

EBNF_CASES = [
    Case("arithmetic", "ebnf", ARITH, "Write an arithmetic expression.", outlines_ok=False),
    Case(
        "key_values",
        "ebnf",
        KEY_VALUES,
        "Write some settings as key=value pairs.",
        outlines_ok=False,
    ),
    Case("greeting", "ebnf", GREETING, "Greet someone by name.", outlines_ok=False),
]

CHOICE_CASES = [
    Case(
        "sentiment",
        "choices",
        ["positive", "negative", "neutral"],
        "Is 'I loved this film' positive or negative?",
    ),
    Case("primary_color", "choices", ["red", "green", "blue"], "Name a primary color."),
    Case("prefix_overlap", "choices", ["yes", "yes please", "no"], "Do you want tea?"),
    Case(
        "punctuated",
        "choices",
        ["Option A: keep", "Option B: drop", "Option C: defer"],
        "Pick an option.",
    ),
]

OBJECT_CASES = [
    Case(
        "object_person",
        "json_object",
        None,
        'Reply with a JSON object like {"name": "Ann"}.',
        outlines_ok=False,
        bounded=False,
    ),
    Case(
        "object_config",
        "json_object",
        None,
        "Reply with a small JSON config object.",
        outlines_ok=False,
        bounded=False,
    ),
]

ALL_CASES = SCHEMA_CASES + REGEX_CASES + EBNF_CASES + CHOICE_CASES + OBJECT_CASES


def _arith_ok(text: str) -> None:
    pos = _parse_expr(text, 0)
    assert pos == len(text), f"{text!r} is not an arithmetic expression"


def _parse_expr(s: str, i: int) -> int:
    i = _parse_term(s, i)
    while i < len(s) and s[i] in "+-":
        i = _parse_term(s, i + 1)
    return i


def _parse_term(s: str, i: int) -> int:
    i = _parse_factor(s, i)
    while i < len(s) and s[i] in "*/":
        i = _parse_factor(s, i + 1)
    return i


def _parse_factor(s: str, i: int) -> int:
    if i < len(s) and s[i] == "(":
        i = _parse_expr(s, i + 1)
        assert i < len(s) and s[i] == ")", f"unclosed parenthesis in {s!r}"
        return i + 1
    j = i
    while j < len(s) and s[j].isdigit():
        j += 1
    assert j > i, f"number expected at {i} in {s!r}"
    return j


EBNF_CHECKERS: dict[str, Callable[[str], None]] = {
    "arithmetic": _arith_ok,
    "key_values": lambda t: _check_regex(
        Case("", "regex", r"[a-z]{1,8}=[0-9]{1,4}(,[a-z]{1,8}=[0-9]{1,4}){0,2}", ""), t
    ),
    "greeting": lambda t: _check_regex(
        Case("", "regex", r"(Hello|Hi|Good morning) [A-Z][a-z]{1,10}!", ""), t
    ),
}
