"""stop_regex matching: the scheduler's finish check, and the detokenizer's hold-back and trim.

Scheduler process: `StopRegexMatcher` decodes the output incrementally (the new tokens with a
few tokens of context, as the detokenizer does) and every check searches the whole output text,
so `^`, lookbehinds and matches of any length behave as on the final text; a search is C-speed
and the text is at most the output. Detokenizer process: a streamed chunk never shows text from
where a match may still begin (`regex`'s partial matches), and the final text ends where the
match begins. Every check runs under a deadline: a pattern that backtracks catastrophically ends
its own request (scheduler) or is no longer held back (detokenizer), never stalls the others.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.interfaces import TextDecoder

# The longest one check of a request's patterns (all of them together) may take: past it the
# request ends with a 400 in the scheduler, and the detokenizer stops holding its text back. A
# sane pattern searches thousands of characters in microseconds.
SEARCH_TIMEOUT_S = 0.02
_CONTEXT_TOKENS = 5  # tokens re-decoded as left context (byte-level BPE, leading spaces)


class StopRegexTimeout(Exception):
    """A check of a request's stop_regex patterns ran past SEARCH_TIMEOUT_S."""

    def __init__(self, pattern: str, text_chars: int) -> None:
        super().__init__(
            f"stop_regex {pattern!r} took over {SEARCH_TIMEOUT_S * 1000:g} ms (all patterns "
            f"together) to search {text_chars} characters of output (catastrophic "
            "backtracking?); simplify the pattern"
        )


def _search(
    compiled: regex.Pattern[str], text: str, pos: int, deadline: float, partial: bool = False
) -> regex.Match[str] | None:
    """One search that must end by `deadline` (time.monotonic); raises StopRegexTimeout."""
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError
        return compiled.search(text, pos, partial=partial, timeout=left)
    except TimeoutError:
        raise StopRegexTimeout(compiled.pattern, len(text)) from None


class StopRegexMatcher:
    """One request's stop_regex patterns and its output text decoded so far."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = compile_patterns(patterns)
        self.text = ""
        self.decoded = 0  # output tokens whose text is in `text`

    def reset(self) -> None:
        """The output was edited (jump-forward re-tokenization): decode it again from the start."""
        self.text = ""
        self.decoded = 0

    def search(self, output_ids: list[int], decoder: TextDecoder) -> str | None:
        """The first pattern that matches the output text, or None; raises StopRegexTimeout."""
        self._extend(output_ids, decoder)
        deadline = time.monotonic() + SEARCH_TIMEOUT_S
        for compiled in self.patterns:
            if _search(compiled, self.text, 0, deadline) is not None:
                return str(compiled.pattern)
        return None

    def _extend(self, ids: list[int], decoder: TextDecoder) -> None:
        if self.decoded >= len(ids):
            return
        start = max(0, self.decoded - _CONTEXT_TOKENS)
        prefix = decoder.decode(ids[start : self.decoded], skip_special_tokens=False)
        full = decoder.decode(ids[start:], skip_special_tokens=False)
        if full.endswith("\ufffd"):
            return  # a character still waits for its last bytes: match once it is whole
        self.text += full[len(prefix) :]
        self.decoded = len(ids)


def compile_patterns(patterns: list[str]) -> list[regex.Pattern[str]]:
    return [regex.compile(p) for p in patterns]


def held_back(text: str, patterns: list[regex.Pattern[str]]) -> int:
    """Length of the tail of `text` from where a match may still begin (not streamed yet);
    raises StopRegexTimeout past SEARCH_TIMEOUT_S (the caller then stops holding back)."""
    start = len(text)
    deadline = time.monotonic() + SEARCH_TIMEOUT_S
    for compiled in patterns:
        pos = 0
        while pos <= len(text):
            found = _search(compiled, text, pos, deadline, partial=True)
            if found is None:
                break
            if found.partial:
                start = min(start, found.start())
                break
            # a whole match the request did not stop on (before min_new_tokens): look past it
            pos = found.end() if found.end() > found.start() else found.start() + 1
    return len(text) - start


def match_start(text: str, pattern: str) -> int | None:
    """Where the first match of `pattern` begins in the final text (the text is cut there)."""
    try:
        found = _search(regex.compile(pattern), text, 0, time.monotonic() + SEARCH_TIMEOUT_S)
    except StopRegexTimeout:
        return None
    return None if found is None else found.start()
