"""Where a JSON or Python-literal value ends in text that may still be growing (API process).

The tool-call parsers rescan the whole reply at every streamed chunk; these scanners tell them
whether a value is complete yet (its end index) or not (None), without parsing it.
"""

from __future__ import annotations

import re

_CLOSERS = {"{": "}", "[": "]", "(": ")"}
_SCALAR_ENDS = frozenset(",}])\n\r\t ")
_STRING_SPECIAL = {q: re.compile(rf"[{q}\\]") for q in "\"'"}
_JSON_STRUCTURAL = re.compile(r'["{}\[\]]')
_PY_STRUCTURAL = re.compile(r"[\"'{}\[\]()]")


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """End (exclusive) of the string literal opening at text[i] (its quote char), or None."""
    special = _STRING_SPECIAL[text[i]]
    j = i + 1
    while True:
        m = special.search(text, j)
        if m is None:
            return None
        if m.group() == "\\":
            j = m.start() + 2
            continue
        return m.end()


def value_end(text: str, i: int, python: bool = False) -> int | None:
    """End (exclusive) of the JSON value starting at text[i] (a Python literal if `python`:
    also single quotes and tuples), or None while it is incomplete.

    A scalar (number, true, None, ...) counts as complete only once a delimiter follows it,
    since more digits may still come."""
    if i >= len(text):
        return None
    quotes = "\"'" if python else '"'
    if text[i] in quotes:
        return string_end(text, i)
    if text[i] in _CLOSERS and (python or text[i] != "("):
        stack = [_CLOSERS[text[i]]]
        structural = _PY_STRUCTURAL if python else _JSON_STRUCTURAL
        j = i + 1
        while True:
            m = structural.search(text, j)  # jump to the next quote or bracket
            if m is None:
                return None
            ch, j = m.group(), m.start()
            if ch in quotes:
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if ch in _CLOSERS:
                stack.append(_CLOSERS[ch])
            elif ch == stack[-1]:
                stack.pop()
                if not stack:
                    return j + 1
            j += 1
    j = i
    while j < len(text) and text[j] not in _SCALAR_ENDS:
        j += 1
    return j if j < len(text) and j > i else None
