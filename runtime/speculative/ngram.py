"""N-gram drafting: the tokens that followed earlier occurrences of a request's suffix
(scheduler process).

A request's own prompt and output are its corpus: documents quoted into answers, JSON fields
copied from the text, tool names repeated. A lookup lists the earlier occurrences of the
request's suffix, the longest matches first: the candidates a draft tree is built from
(runtime/speculative/draft_tree.py).
"""

from __future__ import annotations

from typing import NamedTuple


class Candidate(NamedTuple):
    """An earlier occurrence of the request's suffix: `match` tokens long, continuing at `start`."""

    match: int
    start: int


class NgramIndex:
    """Where each token and each pair of tokens of a request (prompt, then output) ended, kept
    as the request grows, to find earlier occurrences of its suffix.

    A lookup takes the earlier ends of the request's last two tokens, extends each match
    backwards token by token (up to max_n), then fills up with the ends of its last token
    alone. Appending a token costs two dict appends; a 1.5k-token prompt is indexed at its
    first lookup (~1 ms), and a lookup then costs microseconds: numpy's vectorised search of
    the whole sequence cost ~0.2 ms a step in situ (a dozen small array operations, each on
    caches the forward's weight stream had just cooled)."""

    __slots__ = ("_len", "_pair_ends", "_token_ends", "max_n", "min_n")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self._token_ends: dict[int, list[int]] = {}  # token -> the e with tokens[e - 1] == it
        self._pair_ends: dict[tuple[int, int], list[int]] = {}  # (a, b) -> e: tokens[e-2:e]
        self._len = 0

    def _sync(self, tokens: list[int]) -> None:
        n = len(tokens)
        if n < self._len:  # rewritten: index again
            self._token_ends.clear()
            self._pair_ends.clear()
            self._len = 0
        token_ends, pair_ends = self._token_ends, self._pair_ends
        prev = tokens[self._len - 1] if self._len else -1
        for e in range(self._len + 1, n + 1):
            tok = tokens[e - 1]
            token_ends.setdefault(tok, []).append(e)
            if e > 1:
                pair_ends.setdefault((prev, tok), []).append(e)
            prev = tok
        self._len = n

    def candidates(self, tokens: list[int], breadth: int) -> list[Candidate]:
        """Up to `breadth` earlier occurrences of suffixes of `tokens` (at least min_n tokens
        long, matched up to max_n), best first: the longest match first, the latest occurrence
        first within a length.

        `tokens` must extend the list of the previous call (callers reset the index when a
        request's tokens are rewritten)."""
        end = len(tokens)
        if breadth <= 0 or end < self.min_n + 1:
            return []
        self._sync(tokens)
        top = min(self.max_n, end - 1)  # the longest match counted
        found: list[Candidate] = []
        if top >= 2:
            for e in reversed(self._pair_ends.get((tokens[end - 2], tokens[end - 1]), ())):
                if e == end:
                    continue  # the suffix itself
                m = 2
                while m < top and m < e and tokens[e - 1 - m] == tokens[end - 1 - m]:
                    m += 1
                if m >= self.min_n:
                    found.append(Candidate(m, e))
            found.sort(key=lambda c: -c.match)  # stable: the latest first within a length
            del found[breadth:]
        if len(found) < breadth and self.min_n <= 1:
            before = tokens[end - 2] if top >= 2 else None
            for e in reversed(self._token_ends.get(tokens[end - 1], ())):
                if e == end or (e > 1 and tokens[e - 2] == before):
                    continue  # the suffix itself, or a longer match listed above
                found.append(Candidate(1, e))
                if len(found) == breadth:
                    break
        return found


def continuation(tokens: list[int], start: int, k: int) -> list[int]:
    """The k tokens from `start`, continuing periodically past the end: an occurrence that
    overlaps the suffix it matched (a repeated pattern) repeats with period len - start."""
    out = tokens[start : start + k]
    period = len(tokens) - start
    while len(out) < k:
        out.append(out[len(out) - period])
    return out
