"""Speculative decoding settings (`--speculative-*` flags): a `ServerArgs` group of its own.

Imported by every process (no torch). The scheduler reads it to draft n-gram continuations from
each request's own tokens and verify them in one extend step (runtime/speculative/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from radixgen.errors import InvalidRequestError

_T = TypeVar("_T")


def _f(default: _T, help: str, choices: tuple[str, ...] | None = None) -> _T:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class SpeculativeConfig:
    speculative_algorithm: str | None = _f(
        None,
        "Speculative decoding: NGRAM drafts each decoding request's next tokens from the longest "
        "match of its recent tokens in its own prompt and output and verifies them in one step: "
        "greedy and seeded sampled outputs exactly as without it (each verified position draws "
        "with the request's own uniform for it), constrained ones walked by their grammar. With "
        "overlap scheduling a step runs overlapped only while no running request can draft.",
        ("NGRAM",),
    )
    speculative_num_draft_tokens: int = _f(
        8, "Most draft tokens verified per request and step (each request adapts below it)."
    )
    speculative_ngram_min_match_window_size: int = _f(
        1, "Shortest suffix of a request's tokens matched to find a draft."
    )
    speculative_ngram_max_match_window_size: int = _f(
        8, "Longest suffix matched (the longest match found wins; the latest occurrence of it)."
    )
    speculative_max_verify_tokens: int = _f(
        48,
        "Most draft tokens verified in one step over the whole batch; the most probable per "
        "millisecond they add go first. A step with this many decoding requests or more runs "
        "without drafts (compute-bound: verifying costs more than it saves).",
    )

    speculative_ngram_max_bfs_breadth: int = _f(
        4,
        "Most earlier occurrences of a request's suffix whose continuations form its draft tree "
        "(merged where they agree; verification follows the branch the model takes). 1: one "
        "chain. Trees need --page-size 1 (with larger pages a draft is one chain).",
    )
    speculative_ngram_capacity: int = _f(
        65536,
        "Tokens of finished requests' outputs (each with its prompt's last few tokens) kept to "
        "draft from when a request's own tokens offer fewer continuations than the tree's "
        "breadth: repeated agent turns, extractions that answer alike, a question asked again. "
        "The oldest outputs go first; the cache flush empties it; 0: a request drafts from its "
        "own tokens only. (SGLang counts its n-gram trie's nodes here; this counts tokens.)",
    )
    speculative_break_even_tokens: int = _f(
        0,
        "0 (default): which draft tokens run is decided from step times measured as the server "
        "runs (a token runs when its acceptance probability per millisecond it adds beats the "
        "step's tokens per millisecond). N > 0: a fixed rule instead, a step computing T "
        "tokens costing N + T token-times (N: the step's fixed cost in tokens).",
    )

    speculative_greedy_only: bool = _f(
        False,
        "Speculate for greedy requests only (sampled ones otherwise verify drafts by drawing "
        "each position as decoding would: the same samples, drafts accepted with probability "
        "p(draft)).",
    )

    @property
    def enabled(self) -> bool:
        return self.speculative_algorithm is not None

    def validate(self) -> None:
        for name in (
            "speculative_num_draft_tokens",
            "speculative_ngram_min_match_window_size",
            "speculative_max_verify_tokens",
            "speculative_ngram_max_bfs_breadth",
        ):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", name)
        if self.speculative_ngram_capacity < 0:
            raise InvalidRequestError(
                "speculative_ngram_capacity must be >= 0", "speculative_ngram_capacity"
            )
        if self.speculative_break_even_tokens < 0:
            raise InvalidRequestError(
                "speculative_break_even_tokens must be >= 0", "speculative_break_even_tokens"
            )
        if self.speculative_num_draft_tokens > 32:
            raise InvalidRequestError(
                "speculative_num_draft_tokens must be <= 32", "speculative_num_draft_tokens"
            )
        if (
            self.speculative_ngram_max_match_window_size
            < self.speculative_ngram_min_match_window_size
        ):
            raise InvalidRequestError(
                "speculative_ngram_max_match_window_size must be >= "
                "speculative_ngram_min_match_window_size",
                "speculative_ngram_max_match_window_size",
            )
