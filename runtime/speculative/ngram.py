"""N-gram drafting: the tokens that followed earlier occurrences of a request's suffix
(scheduler process).

A request's own prompt and output are its corpus: documents quoted into answers, JSON fields
copied from the text, tool names repeated. A lookup lists the earlier occurrences of the
request's suffix, the longest matches first: the candidates a draft tree is built from
(runtime/speculative/draft_tree.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Candidate(NamedTuple):
    """An earlier occurrence of the request's suffix: `match` tokens long, continuing at `start`."""

    match: int
    start: int


class NgramIndex:
    """A request's tokens (prompt, then output) in a growing array, searched for earlier
    occurrences of its suffixes.

    No n-gram table is built: a lookup finds every earlier occurrence of the last token with one
    vectorised comparison and extends each match backwards, a few vectorised steps (one per
    further token matched, while any match is still growing). Appending costs nothing per
    token, so a long prompt costs nothing until it is searched, and a search costs tens of
    microseconds."""

    __slots__ = ("_buf", "_len", "max_n", "min_n")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self._buf = np.empty(0, dtype=np.int64)
        self._len = 0

    def _sync(self, tokens: list[int]) -> np.ndarray:
        n = len(tokens)
        if n > self._buf.size:
            grown = np.empty(max(n, 2 * self._buf.size, 256), dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        if n > self._len:
            self._buf[self._len : n] = tokens[self._len : n]
        self._len = n
        return self._buf[:n]

    def candidates(self, tokens: list[int], breadth: int) -> list[Candidate]:
        """Up to `breadth` earlier occurrences of suffixes of `tokens` (at least min_n tokens
        long, matched up to max_n), best first: the longest match first, the latest occurrence
        first within a length.

        `tokens` must extend the list of the previous call (callers reset the index when a
        request's tokens are rewritten)."""
        end = len(tokens)
        if breadth <= 0 or end < self.min_n + 1:
            return []
        arr = self._sync(tokens)
        # continuation starts e of occurrences ending at e (their last token arr[e - 1])
        starts = np.flatnonzero(arr[: end - 1] == arr[end - 1]) + 1
        if starts.size == 0:
            return []
        match = np.ones(starts.size, dtype=np.int64)
        growing = np.ones(starts.size, dtype=bool)
        for i in range(1, min(self.max_n, end - 1)):
            at = starts - 1 - i
            same = growing & (at >= 0)
            same[same] = arr[at[same]] == arr[end - 1 - i]
            match += same
            growing = same
            if not growing.any():
                break
        ok = match >= self.min_n
        if not ok.all():
            starts, match = starts[ok], match[ok]
        order = np.lexsort((-starts, -match))[:breadth]
        return [Candidate(int(match[j]), int(starts[j])) for j in order]


def continuation(tokens: list[int], start: int, k: int) -> list[int]:
    """The k tokens from `start`, continuing periodically past the end: an occurrence that
    overlaps the suffix it matched (a repeated pattern) repeats with period len - start."""
    out = tokens[start : start + k]
    period = len(tokens) - start
    while len(out) < k:
        out.append(out[len(out) - period])
    return out
