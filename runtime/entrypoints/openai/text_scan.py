"""Where a JSON or Python-literal value ends in text that may still be growing (API process).

The tool-call parsers rescan the whole reply at every streamed chunk; these scanners tell them
whether a value is complete yet (its end index) or not (None), without parsing it.
"""

from __future__ import annotations

_CLOSERS = {"{": "}", "[": "]", "(": ")"}
_SCALAR_ENDS = frozenset(",}])\n\r\t ")


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """End (exclusive) of the string literal opening at text[i] (its quote char), or None."""
    quote = text[i]
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == quote:
            return j + 1
        j += 1
    return None


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
        j = i + 1
        while j < len(text):
            ch = text[j]
            if ch in quotes:
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if ch in _CLOSERS and (python or ch != "("):
                stack.append(_CLOSERS[ch])
            elif ch == stack[-1]:
                stack.pop()
                if not stack:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(text) and text[j] not in _SCALAR_ENDS:
        j += 1
    return j if j < len(text) and j > i else None
