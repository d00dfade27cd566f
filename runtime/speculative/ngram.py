"""N-gram drafting: the next tokens after the latest earlier occurrence of a request's suffix
(scheduler process).

A request's own prompt and output are its corpus: documents quoted into answers, JSON fields
copied from the text, tool names repeated. Each request keeps an index from every n-gram
(n in [min_n, max_n]) of its tokens to the position after its latest occurrence, grown
incrementally as tokens arrive, so a lookup costs at most max_n - min_n + 1 dict probes.
"""

from __future__ import annotations


class NgramIndex:
    """Per-request n-gram index over a growing token list (prompt, then output)."""

    __slots__ = ("_indexed", "_next", "max_n", "min_n")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        # n-gram -> position right after its latest occurrence that has a continuation
        self._next: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # end positions < this are in `_next`

    def _extend(self, tokens: list[int]) -> None:
        # NOTE: an occurrence ending at len(tokens) has no continuation yet: indexed next time
        end = len(tokens)
        table = self._next
        lo, hi = self.min_n, self.max_n
        for e in range(max(self._indexed, lo), end):
            for n in range(lo, min(hi, e) + 1):
                table[tuple(tokens[e - n : e])] = e
        self._indexed = max(self._indexed, end)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest suffix of `tokens` seen earlier in it.

        `tokens` must extend the list of the previous call (callers reset the index when a
        request's tokens are rewritten)."""
        if k <= 0 or len(tokens) < self.min_n + 1:
            return []
        self._extend(tokens)
        end = len(tokens)
        table = self._next
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            pos = table.get(tuple(tokens[end - n :]))
            if pos is not None:
                return tokens[pos : pos + k]
        return []


class DraftState:
    """A request's drafting state: its n-gram index and its adaptive draft length.

    The length doubles after a draft accepted whole and shrinks to one more than the accepted
    part otherwise. After drafts with nothing accepted the request sits out a growing number of
    steps (up to MAX_COOLDOWN); while its share of accepted draft tokens is below what pays in
    the step (`should_draft`'s threshold) it drafts only once every PROBE_INTERVAL steps, so
    text that does not repeat itself costs almost nothing and text that starts to is noticed.
    """

    __slots__ = ("accept_rate", "cooldown", "draft_len", "index", "misses", "threshold")

    MAX_COOLDOWN = 8
    PROBE_INTERVAL = 8

    def __init__(self, min_n: int, max_n: int, draft_len: int) -> None:
        self.index = NgramIndex(min_n, max_n)
        self.draft_len = draft_len
        self.accept_rate = 0.5  # EMA of accepted / drafted tokens
        self.misses = 0
        self.cooldown = 0
        self.threshold = 0.0  # the last step's acceptance share that pays

    def should_draft(self, threshold: float) -> int:
        """Most tokens to draft this step (0: none), where drafts pay when accept_rate exceeds
        `threshold`; below it, a one-token probe every PROBE_INTERVAL steps."""
        self.threshold = threshold
        if self.cooldown > 0:
            self.cooldown -= 1
            return 0
        if self.accept_rate < threshold:
            self.cooldown = self.PROBE_INTERVAL
            return 1
        return self.draft_len

    def record(self, drafted: int, accepted: int, max_len: int) -> None:
        """Adapt to one verification: `accepted` of `drafted` draft tokens were right."""
        self.accept_rate = 0.7 * self.accept_rate + 0.3 * (accepted / drafted)
        if accepted == drafted:
            self.draft_len = min(max_len, self.draft_len * 2)
        else:
            self.draft_len = max(1, accepted + 1)
        if accepted == 0:
            self.misses += 1
            self.cooldown = max(self.cooldown, min(self.MAX_COOLDOWN, (1 << self.misses) - 1))
        else:
            self.misses = 0
            if self.accept_rate >= self.threshold:
                self.cooldown = 0  # a probe that hit enough: back to drafting
