"""N-gram drafting: the tokens that followed earlier occurrences of a request's suffix
(scheduler process).

A request's own prompt and output are its first corpus: documents quoted into answers, JSON
fields copied from the text, tool names repeated. The recent outputs of finished requests are
the second (`SharedCorpus`): an agent program's repeated turns, a batch of extractions answering
alike, the same question asked again. A lookup lists the earlier occurrences of the request's
suffix, the longest matches first: the candidates a draft tree is built from
(runtime/speculative/draft_tree.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import NamedTuple, TypeVar


class Candidate(NamedTuple):
    """An earlier occurrence of the request's suffix: `match` tokens long, continuing at `start`
    in the request's own tokens, or (from the shared corpus) with its continuation `follow`."""

    match: int
    start: int
    follow: list[int] | None = None


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
        return _ranked_matches(
            tokens, 0, tokens, top, self.min_n, breadth,
            reversed(self._pair_ends.get((tokens[end - 2], tokens[end - 1]), ())),
            reversed(self._token_ends.get(tokens[end - 1], ())),
            lambda e: e != end,  # not the suffix itself
        )  # fmt: skip


def _ranked_matches(
    text: list[int],
    off: int,
    tokens: list[int],
    top: int,
    min_n: int,
    breadth: int,
    pair_ends: Iterable[int],
    token_ends: Iterable[int],
    usable: Callable[[int], bool],
) -> list[Candidate]:
    """The search both indexes run: occurrences in `text` (whose first element is at absolute
    position `off`) of the suffix of `tokens`, given the ends of its last pair and of its last
    token, latest first. Pair ends are extended backwards to their match length (up to `top`,
    at least `min_n`) and ranked longest first; single-token ends fill up what is left of
    `breadth`. `usable(e)` rules an end out (the suffix itself, nothing after it)."""
    end = len(tokens)
    found: list[Candidate] = []
    if top >= 2:
        for e in pair_ends:
            if not usable(e):
                continue
            at = e - off
            m = 2
            while m < top and m < at and text[at - 1 - m] == tokens[end - 1 - m]:
                m += 1
            if m >= min_n:
                found.append(Candidate(m, e))
        found.sort(key=lambda c: -c.match)  # stable: the latest first within a length
        del found[breadth:]
    if len(found) < breadth and min_n <= 1:
        before = tokens[end - 2] if top >= 2 else None
        for e in token_ends:
            at = e - off
            if (at > 1 and text[at - 2] == before) or not usable(e):
                continue  # a longer match listed above, or ruled out
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


SEPARATOR = -1  # before each of the shared corpus's sequences: equal to no token


class SharedCorpus:
    """The recent outputs of finished requests (each after the last few tokens of its prompt,
    so that a new request's first output tokens can match), searched like a request's own
    tokens for a suffix of the request being drafted; at most `capacity` tokens, the oldest
    sequences dropped first. A common pair of tokens can end thousands of times in the corpus:
    the longest matches are looked for among its `SCAN` latest occurrences.

    Where each token and pair of tokens ended is kept per key in order, so dropping a sequence
    pops its entries from the fronts (as cheap as adding them); the separator before each
    sequence stops a match, and a continuation, at a sequence's edge."""

    SCAN = 64

    def __init__(self, capacity: int, min_n: int, max_n: int) -> None:
        self.capacity = capacity
        self.min_n = min_n
        self.max_n = max_n
        self.clear()

    def clear(self) -> None:
        self._buf: list[int] = []  # sequences, each after a SEPARATOR
        self._off = 0  # absolute position of _buf[0]
        self._seqs: deque[tuple[int, int]] = deque()  # (separator position, end) per sequence
        self._size = 0  # tokens held
        self._token_ends: dict[int, deque[int]] = {}
        self._pair_ends: dict[tuple[int, int], deque[int]] = {}

    def __len__(self) -> int:
        return self._size

    def add(self, tokens: list[int]) -> None:
        """Keep a finished request's tokens (its prompt's tail, then its output)."""
        tokens = tokens[-self.capacity :] if self.capacity > 0 else []
        if not tokens:
            return
        while self._seqs and self._size + len(tokens) > self.capacity:
            self._drop_oldest()
        sep = self._off + len(self._buf)
        self._buf.append(SEPARATOR)
        self._buf.extend(tokens)
        prev = SEPARATOR
        for e, tok in enumerate(tokens, sep + 2):  # e: the end of the occurrence ending at tok
            self._token_ends.setdefault(tok, deque()).append(e)
            if prev != SEPARATOR:
                self._pair_ends.setdefault((prev, tok), deque()).append(e)
            prev = tok
        self._seqs.append((sep, sep + 1 + len(tokens)))
        self._size += len(tokens)

    def _drop_oldest(self) -> None:
        sep, end = self._seqs.popleft()
        buf, off = self._buf, self._off
        prev = SEPARATOR
        for pos in range(sep + 1, end):
            tok = buf[pos - off]
            _pop_front(self._token_ends, tok)
            if prev != SEPARATOR:
                _pop_front(self._pair_ends, (prev, tok))
            prev = tok
        self._size -= end - sep - 1
        del buf[: end - off]
        self._off = end

    def candidates(self, tokens: list[int], breadth: int, depth: int) -> list[Candidate]:
        """Up to `breadth` occurrences of suffixes of `tokens` in the corpus (at least min_n
        tokens long, matched up to max_n), ordered as `NgramIndex.candidates` orders them, each
        with its next `depth` tokens (fewer at its sequence's end; an occurrence with nothing
        after it is none)."""
        end = len(tokens)
        if breadth <= 0 or depth <= 0 or end < max(self.min_n, 1) or not self._seqs:
            return []
        buf, off = self._buf, self._off
        top = min(self.max_n, end)  # the longest match counted
        found = _ranked_matches(
            buf, off, tokens, top, self.min_n, breadth,
            islice(reversed(self._pair_ends.get((tokens[end - 2], tokens[end - 1]), ())), self.SCAN),
            reversed(self._token_ends.get(tokens[end - 1], ())),
            lambda e: _has_next(buf, e - off),  # a token follows it in its sequence
        )  # fmt: skip
        return [Candidate(c.match, c.start, self._follow(c.start, depth)) for c in found]

    def _follow(self, start: int, depth: int) -> list[int]:
        out = self._buf[start - self._off : start - self._off + depth]
        if SEPARATOR in out:
            del out[out.index(SEPARATOR) :]
        return out


def _has_next(buf: list[int], at: int) -> bool:
    return at < len(buf) and buf[at] != SEPARATOR


_K = TypeVar("_K")


def _pop_front(index: dict[_K, deque[int]], key: _K) -> None:
    ends = index[key]
    ends.popleft()
    if not ends:
        del index[key]
