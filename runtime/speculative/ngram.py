"""N-gram drafting: the tokens that followed earlier occurrences of a request's suffix
(scheduler process).

A request's own prompt and output are its corpus: documents quoted into answers, JSON fields
copied from the text, tool names repeated. Each request keeps an index from every n-gram
(n in [min_n, max_n]) of its tokens to its latest occurrence, and from each occurrence to the
one before it, grown incrementally as tokens arrive. A lookup walks the longest matching
suffix's occurrences first, then shorter ones': the candidates a draft tree is built from
(runtime/speculative/draft_tree.py).
"""

from __future__ import annotations

from typing import NamedTuple


class Candidate(NamedTuple):
    """An earlier occurrence of the request's suffix: `match` tokens long, continuing at `start`."""

    match: int
    start: int


class NgramIndex:
    """Per-request n-gram index over a growing token list (prompt, then output)."""

    __slots__ = ("_indexed", "_latest", "_prev", "max_n", "min_n")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        # n-gram -> end (exclusive) of its latest occurrence that has a continuation
        self._latest: dict[tuple[int, ...], int] = {}
        # per n: end of the occurrence before the one ending at e (-1: none), indexed by e
        self._prev: list[list[int]] = [[] for _ in range(max_n - min_n + 1)]
        self._indexed = 0  # end positions < this are indexed

    def _extend(self, tokens: list[int]) -> None:
        # NOTE: an occurrence ending at len(tokens) has no continuation yet: indexed next time
        latest = self._latest
        lo = self.min_n
        for e in range(self._indexed, len(tokens)):
            for j, prev in enumerate(self._prev):
                n = lo + j
                if n > e:
                    prev.append(-1)
                    continue
                key = tuple(tokens[e - n : e])
                prev.append(latest.get(key, -1))
                latest[key] = e
        self._indexed = max(self._indexed, len(tokens))

    def candidates(self, tokens: list[int], breadth: int) -> list[Candidate]:
        """Up to `breadth` earlier occurrences of suffixes of `tokens`, best first: the longest
        match first, the latest occurrence first within a length; each continuation start once.

        `tokens` must extend the list of the previous call (callers reset the index when a
        request's tokens are rewritten)."""
        end = len(tokens)
        if breadth <= 0 or end < self.min_n + 1:
            return []
        self._extend(tokens)
        out: list[Candidate] = []
        seen: set[int] = set()
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            pos = self._latest.get(tuple(tokens[end - n :]), -1)
            prev = self._prev[n - self.min_n]
            while pos >= 0:
                if pos not in seen:
                    seen.add(pos)
                    out.append(Candidate(n, pos))
                    if len(out) == breadth:
                        return out
                pos = prev[pos]
        return out

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest occurrence of the longest suffix of `tokens`
        seen earlier in it (the best candidate's continuation)."""
        found = self.candidates(tokens, 1)
        return continuation(tokens, found[0].start, k) if found and k > 0 else []


def continuation(tokens: list[int], start: int, k: int) -> list[int]:
    """The k tokens from `start`, continuing periodically past the end: an occurrence that
    overlaps the suffix it matched (a repeated pattern) repeats with period len - start."""
    out = tokens[start : start + k]
    period = len(tokens) - start
    while len(out) < k:
        out.append(out[len(out) - period])
    return out
