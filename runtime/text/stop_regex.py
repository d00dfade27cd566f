"""stop_regex matching: the scheduler's finish check, and the detokenizer's hold-back and trim.

Scheduler process: `StopRegexMatcher` decodes the output incrementally (the new tokens with a
few tokens of context, as the detokenizer does) and every check searches the whole output text,
so `^`, lookbehinds and matches of any length behave as on the final text; a search is C-speed
and the text is at most the output. Detokenizer process: a streamed chunk never shows text from
where a match may still begin (`regex`'s partial matches), and the final text ends where the
match begins. Every search runs under a timeout: a pattern that backtracks catastrophically ends
its own request (scheduler) or is not held back (detokenizer), never stalls the other requests.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.interfaces import TextDecoder

logger = logging.getLogger(__name__)

# The longest one search may take before the request is ended with a 400 (a sane pattern
# searches thousands of characters in microseconds).
SEARCH_TIMEOUT_S = 0.05
_CONTEXT_TOKENS = 5  # tokens re-decoded as left context (byte-level BPE, leading spaces)


class StopRegexTimeout(Exception):
    """A stop_regex search ran past SEARCH_TIMEOUT_S."""

    def __init__(self, pattern: str, text_chars: int) -> None:
        super().__init__(
            f"stop_regex {pattern!r} took over {SEARCH_TIMEOUT_S * 1000:g} ms to search "
            f"{text_chars} characters of output (catastrophic backtracking?); simplify the pattern"
        )


class StopRegexMatcher:
    """One request's stop_regex patterns and its output text decoded so far."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = [(p, regex.compile(p)) for p in patterns]
        self.text = ""
        self.decoded = 0  # output tokens whose text is in `text`

    def reset(self) -> None:
        """The output was edited (jump-forward re-tokenization): decode it again from the start."""
        self.text = ""
        self.decoded = 0

    def search(self, output_ids: list[int], decoder: TextDecoder) -> str | None:
        """The first pattern that matches the output text, or None; raises StopRegexTimeout."""
        self._extend(output_ids, decoder)
        for pattern, compiled in self.patterns:
            try:
                found = compiled.search(self.text, timeout=SEARCH_TIMEOUT_S)
            except TimeoutError:
                raise StopRegexTimeout(pattern, len(self.text)) from None
            if found is not None:
                return pattern
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
    """Length of the tail of `text` from where a match may still begin (not streamed yet)."""
    start = len(text)
    for compiled in patterns:
        pos = 0
        try:
            while pos <= len(text):
                found = compiled.search(text, pos, partial=True, timeout=SEARCH_TIMEOUT_S)
                if found is None:
                    break
                if found.partial:
                    start = min(start, found.start())
                    break
                # a whole match the request did not stop on (before min_new_tokens): look past it
                pos = found.end() if found.end() > found.start() else found.start() + 1
        except TimeoutError:
            logger.warning(
                "stop_regex %r timed out while streaming; not held back", compiled.pattern
            )
    return len(text) - start


def match_start(text: str, pattern: str) -> int | None:
    """Where the first match of `pattern` begins in the final text (the text is cut there)."""
    try:
        found = regex.search(pattern, text, timeout=SEARCH_TIMEOUT_S)
    except TimeoutError:
        return None
    return None if found is None else found.start()
