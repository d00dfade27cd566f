"""Parse and check constraint specs before a backend sees them, and turn library errors into clear text.

Runs on the grammar compile worker. Every failure raises `GrammarError` whose message starts with
"invalid <kind>: ..." so a client can tell which part of its request was wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixgen.errors import GrammarError

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


def load_json_schema(spec: str) -> dict[str, Any] | bool:
    """The schema as an object; its text must be JSON and its top level an object or a boolean."""
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as e:
        raise invalid("json_schema", f"not valid JSON ({e})") from None
    if not isinstance(schema, (dict, bool)):
        raise invalid("json_schema", f"a schema must be a JSON object, got {type(schema).__name__}")
    return schema


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
