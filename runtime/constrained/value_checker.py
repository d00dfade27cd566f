"""The checked layer's run-time side: validates each checked value of an output as it completes.

Runs on the scheduler thread, only for requests whose schema has checks (schema_checks.py):
others carry no checker and pay nothing. A small incremental JSON tracker over the output's
bytes knows each value's instance path and where it starts; when a value at a checked path
completes it is validated against its subschema (jsonschema), and an item of a `uniqueItems`
array is compared with the earlier items as soon as it completes (rolling back one item is
cheaper than the whole array). A failure names the output token where the value starts: the
scheduler rolls the request back to it (KV, grammar, output) and bans that token there, a
bounded number of times per position, so decoding terminates and no invalid output is sent.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import best_match

from radixgen.runtime.constrained.schema_checks import CheckPlan, ValueCheck

# rollbacks to one output position before the search moves a token back, and (times 8) to one
# request before it ends with an abort naming the keyword: each costs a token's forward again
MAX_VALUE_ROLLBACKS = 8
_REQUEST_BOUND_FACTOR = 8

_WS = frozenset(b" \t\r\n")
_SCALAR = frozenset(b"+-.0123456789eEtruefalsn")


@dataclass(frozen=True)
class CheckFailure:
    """A completed value that failed its check: the output token where it starts, and why."""

    token_index: int
    keyword: str
    pointer: str  # the value's JSON pointer (messages)
    last_token: int  # the output token holding the value's last byte


class _Frame:
    """An open object or array."""

    __slots__ = ("check", "index", "is_object", "key", "path", "seen", "start")

    def __init__(
        self, is_object: bool, path: tuple[str | int, ...], start: int, check: int | None
    ) -> None:
        self.is_object = is_object
        self.path = path
        self.start = start
        self.check = check
        self.key: str = ""
        self.index = 0
        self.seen: set[str] | None = None  # canonical items, for a uniqueItems array


class ValueChecker:
    """One request's tracker, checks, rollback counts and banned tokens per output position."""

    def __init__(
        self, plan: CheckPlan, token_bytes: list[bytes], max_rollbacks: int = MAX_VALUE_ROLLBACKS
    ) -> None:
        self.plan = plan
        self.token_bytes = token_bytes
        self.max_rollbacks = max_rollbacks
        self._base = validators.validator_for(plan.root)(plan.root)
        self._validators: dict[int, Any] = {}
        self.rollbacks: dict[int, int] = {}  # output position -> rollbacks to it
        self.banned: dict[int, set[int]] = {}  # output position -> token ids banned there
        self.total_rollbacks = 0
        self._reset()

    # --- the scheduler's calls ------------------------------------------------------------------

    def advance(self, output_ids: list[int], terminated: bool) -> CheckFailure | None:
        """Feed the output tokens not seen yet; the first failed check, if any.

        `terminated`: the grammar has ended, so a number at the root is complete.
        """
        while self.fed < len(output_ids):
            tok = output_ids[self.fed]
            self.fed += 1
            self.token_starts.append(len(self.text))
            data = self.token_bytes[tok] if 0 <= tok < len(self.token_bytes) else b""
            failure = self._feed(data)
            if failure is not None:
                return failure
        if terminated and self.scalar_start >= 0 and not self.frames:
            return self._end_scalar(len(self.text))
        return None

    def truncate(self, keep: int, output_ids: list[int]) -> None:
        """Forget the tokens from output index `keep` on (rollback): replay the rest."""
        if keep >= self.fed:
            return
        self._reset()
        self._replaying = True
        try:
            self.advance(output_ids[:keep], False)
        finally:
            self._replaying = False

    def retry_position(self, failure: CheckFailure, output_len: int) -> int | None:
        """Where to redo a failed value: its latest token with rollbacks left (a depth-first
        search from the value's end: "12" for a multiple of 5 is redone as "1?" before "?"),
        never the first output token (the prompt's last token would need recomputing). A
        repeated item is redone from its front instead, starting one token before it (the
        separator, whose alternative is often the array's end): its last tokens rarely matter."""
        last = min(failure.last_token, output_len - 1)
        if failure.keyword == "uniqueItems":
            order = range(failure.token_index - 1, last + 1)
        else:
            order = range(last, failure.token_index - 1, -1)
        for pos in order:
            if pos >= 1 and self.rollbacks.get(pos, 0) < self.max_rollbacks:
                return pos
        return None

    def note_rollback(self, position: int, token_id: int) -> bool:
        """Count a rollback to `position` and ban `token_id` there; False past the bound."""
        count = self.rollbacks.get(position, 0) + 1
        if count > self.max_rollbacks:
            return False
        if self.total_rollbacks >= self.max_rollbacks * _REQUEST_BOUND_FACTOR:
            return False  # bounded per request too: a search over many positions must end
        self.rollbacks[position] = count
        for pos in [p for p in self.banned if p > position]:
            del self.banned[pos]  # bans of the continuation being discarded
        self.banned.setdefault(position, set()).add(token_id)
        self.total_rollbacks += 1
        return True

    def bans_at(self, position: int) -> set[int] | None:
        """The tokens banned as output token `position` (None: none)."""
        return self.banned.get(position) if self.banned else None

    # --- the tracker --------------------------------------------------------------------------

    def _reset(self) -> None:
        self.fed = 0
        self.text = bytearray()
        self.token_starts: list[int] = []
        self.frames: list[_Frame] = []
        self.expect = "value"  # value | first (value or ]) | key | first_key | colon | comma | end
        self.in_string = self.escape = self.string_is_key = False
        self.string_start = self.scalar_start = -1
        self.value_path: tuple[str | int, ...] = ()
        self.value_check: int | None = None
        self._replaying = False

    def _feed(self, data: bytes) -> CheckFailure | None:
        base = len(self.text)
        self.text += data
        for offset, c in enumerate(data):
            i = base + offset
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == 0x5C:  # backslash
                    self.escape = True
                elif c == 0x22:  # closing quote
                    self.in_string = False
                    if self.string_is_key:
                        self.frames[-1].key = json.loads(self.text[self.string_start : i + 1])
                        self.expect = "colon"
                    else:
                        failure = self._end_value(self.string_start, i + 1)
                        if failure is not None:
                            return failure
                continue
            if self.scalar_start >= 0:
                if c in _SCALAR:
                    continue
                failure = self._end_scalar(i)
                if failure is not None:
                    return failure
            if c in _WS:
                continue
            failure = self._structural(c, i)
            if failure is not None:
                return failure
        return None

    def _structural(self, c: int, i: int) -> CheckFailure | None:
        expect = self.expect
        if expect in ("value", "first"):
            if c == 0x5D and expect == "first":  # ] of an empty array
                return self._close(i)
            self._start_value(c, i)
        elif expect in ("key", "first_key"):
            if c == 0x7D and expect == "first_key":  # } of an empty object
                return self._close(i)
            if c == 0x22:
                self.in_string, self.string_is_key, self.string_start = True, True, i
        elif expect == "colon":
            if c == 0x3A:
                self.expect = "value"
        elif expect == "comma" and self.frames:
            top = self.frames[-1]
            if c == 0x2C:
                if top.is_object:
                    self.expect = "key"
                else:
                    top.index += 1
                    self.expect = "value"
            elif c in (0x7D, 0x5D):
                return self._close(i)
        return None

    def _start_value(self, c: int, i: int) -> None:
        path = tuple(f.key if f.is_object else f.index for f in self.frames)
        check = next((n for n, ch in enumerate(self.plan.checks) if ch.matches(path)), None)
        if c in (0x7B, 0x5B):  # { or [
            frame = _Frame(c == 0x7B, path, i, check)
            if check is not None and self.plan.checks[check].unique_items and c == 0x5B:
                frame.seen = set()
            self.frames.append(frame)
            self.expect = "first_key" if c == 0x7B else "first"
            return
        self.value_path, self.value_check = path, check
        if c == 0x22:
            self.in_string, self.string_is_key, self.string_start = True, False, i
        else:
            self.scalar_start = i

    def _end_scalar(self, end: int) -> CheckFailure | None:
        start, self.scalar_start = self.scalar_start, -1
        return self._end_value(start, end)

    def _close(self, i: int) -> CheckFailure | None:
        frame = self.frames.pop()
        self.value_path, self.value_check = frame.path, frame.check
        return self._end_value(frame.start, i + 1)

    def _end_value(self, start: int, end: int) -> CheckFailure | None:
        """A value completed: its own check, then its array's uniqueness."""
        self.expect = "comma" if self.frames else "end"
        path, check = self.value_path, self.value_check
        parent = self.frames[-1] if self.frames else None
        unique = parent is not None and parent.seen is not None
        if check is None and not unique:
            return None
        value = json.loads(self.text[start:end])
        if check is not None and not self._replaying:
            keyword = self._validate(check, value)
            if keyword is not None:
                return self._failure(start, end, keyword, path)
        if unique:
            assert parent is not None and parent.seen is not None
            key = _canonical(value)
            if key in parent.seen:
                return self._failure(start, end, "uniqueItems", path)
            parent.seen.add(key)
        return None

    def _validate(self, index: int, value: Any) -> str | None:
        """The keyword the value breaks (None: valid)."""
        validator = self._validators.get(index)
        if validator is None:
            check: ValueCheck = self.plan.checks[index]
            validator = self._validators[index] = self._base.evolve(schema=check.schema)
        error = best_match(validator.iter_errors(value))
        if error is None:
            return None
        keyword = error.validator
        return str(keyword) if keyword else self.plan.checks[index].keywords[0]

    def _failure(
        self, start: int, end: int, keyword: str, path: tuple[str | int, ...]
    ) -> CheckFailure:
        first = max(0, bisect_right(self.token_starts, start) - 1)
        last = max(first, bisect_right(self.token_starts, end - 1) - 1)
        pointer = "".join(f"/{str(p).replace('~', '~0').replace('/', '~1')}" for p in path)
        return CheckFailure(first, keyword, pointer, last)


def _canonical(value: Any) -> str:
    """Equal JSON values (1 and 1.0 too, any key order) give equal strings."""
    return json.dumps(_normalized(value), sort_keys=True)


def _normalized(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value
