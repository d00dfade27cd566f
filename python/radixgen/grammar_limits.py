"""Size and nesting limits of constraint specs, checked without recursion (API and scheduler process).

A deeply nested JSON schema overflows Python's recursion limit in `json.dumps` (a 500 instead
of a 400) and makes grammar compilers take minutes and gigabytes (xgrammar, arrays nested 400
deep: 5 s and 2 GB; 900 deep: 72 s and 10 GB). So every constraint is measured here first, by
iterative walks and regex scans that cannot blow the stack, and refused with a 400 naming the
flag. The API process checks before anything is sent; the scheduler checks again (defence in
depth: the Engine and any other client of the scheduler's socket skip the API's checks).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

from radixgen.errors import GrammarError

DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_SPEC_BYTES = 512 * 1024

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKETS = re.compile(r"[\[\]{}]")
_REGEX_ESCAPE_OR_CLASS = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]", re.DOTALL)
_EBNF_LITERAL_OR_CLASS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:\\.|[^\]\\])*\]', re.DOTALL)
_PARENS = re.compile(r"[()]")


class GrammarLimitFlags(Protocol):
    """The flags the limits come from (`GrammarConfig`, which this module does not import)."""

    @property
    def grammar_max_depth(self) -> int: ...

    @property
    def grammar_max_spec_bytes(self) -> int: ...


@dataclass(frozen=True)
class GrammarSpecLimits:
    """How big and how deeply nested a constraint may be (from `GrammarConfig`)."""

    max_depth: int = DEFAULT_MAX_DEPTH
    max_spec_bytes: int = DEFAULT_MAX_SPEC_BYTES

    @classmethod
    def from_config(cls, config: GrammarLimitFlags) -> GrammarSpecLimits:
        return cls(config.grammar_max_depth, config.grammar_max_spec_bytes)


def object_depth(value: object, stop_after: int) -> int:
    """Nesting depth of a JSON value (a scalar is 0, `{}` is 1); stops once past `stop_after`."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[object] = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def text_depth(kind: str, spec: str) -> int:
    """Nesting depth of a spec's text: JSON brackets, or regex / EBNF parentheses.

    Strings, escapes and character classes are blanked first, so `"[["` or `\\(` do not count.
    """
    if kind == "json_schema":
        opens = _JSON_BRACKETS.findall(_JSON_STRING.sub("", spec))
        steps = [1 if c in "[{" else -1 for c in opens]
    elif kind in ("regex", "ebnf"):
        pattern = _REGEX_ESCAPE_OR_CLASS if kind == "regex" else _EBNF_LITERAL_OR_CLASS
        steps = [1 if c == "(" else -1 for c in _PARENS.findall(pattern.sub("", spec))]
    else:
        return 0
    return max(accumulate(steps, initial=0))


def check_schema_object(
    schema: object, limits: GrammarSpecLimits, param: str = "json_schema"
) -> None:
    """Refuse a schema given as an object that is nested too deeply (before it is serialised)."""
    depth = object_depth(schema, limits.max_depth)
    if depth > limits.max_depth:
        raise _too_deep(param, limits.max_depth)


def check_constraint(kind: str, spec: str, limits: GrammarSpecLimits) -> None:
    """Refuse a (kind, spec) constraint that is too large or nested too deeply (a 400)."""
    size = len(spec.encode("utf-8", "surrogatepass"))
    if size > limits.max_spec_bytes:
        raise GrammarError(
            f"the {kind} constraint is {size} bytes; the limit is {limits.max_spec_bytes} "
            "bytes (grammar_max_spec_bytes)",
            kind,
        )
    if text_depth(kind, spec) > limits.max_depth:
        raise _too_deep(kind, limits.max_depth)


def _too_deep(param: str, limit: int) -> GrammarError:
    return GrammarError(
        f"the {param} constraint is nested more than {limit} levels deep; the limit is {limit} "
        "(grammar_max_depth)",
        param,
    )
