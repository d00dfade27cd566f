"""Process-wide switches of the frontend language (SGLang's `global_config`, plus our toggles).

Each program-level optimisation has its own flag so `benchmark/bench_programs.py` can turn it off
and measure what it buys; `optimizations(enabled=False)` flips all of them at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixgen.lang.backend.base import BaseBackend

OPTIMIZATION_FLAGS = (
    "enable_precache_with_tracing",
    "enable_fork_precache",
    "enable_batched_select",
    "enable_constrained_decoding",
)


class GlobalConfig:
    """Mutable on purpose (SGLang's API): programs and benchmarks flip these between runs."""

    def __init__(self) -> None:
        # 0: silent; 2: print the final text of every run
        self.verbosity = 0
        self.default_backend: BaseBackend | None = None
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        # run_batch: trace the program's constant prefix and prefill it once before the batch
        self.enable_precache_with_tracing = True
        # fork(n > 1): prefill the shared text once so every branch hits the radix cache (only
        # when enough of it is new to the server; see executor.FORK_PRECACHE_MIN_CHARS)
        self.enable_fork_precache = True
        # select: score every choice in one batched prefill request (off: one request per choice)
        self.enable_batched_select = True
        # gen(dtype=...) / gen(choices=...): grammar-constrained decoding (off: free text, parse,
        # retry up to `max_parse_retries` times)
        self.enable_constrained_decoding = True
        self.max_parse_retries = 3
        # SGLang's join(mode="concate_and_append") KV concatenation; our servers append text
        self.enable_parallel_encoding = False
        # the prefix hints (run_batch's traced prefix, fork's shared text, `prog.cache()`) ask a
        # RadixGen server with HiCache to pin the prefix in its host tier (`pin_prefix`), so it
        # outlives the pool's and the tier's LRU; other servers ignore the hint
        self.pin_cached_prefixes = False

    def set_optimizations(self, enabled: bool) -> None:
        for name in OPTIMIZATION_FLAGS:
            setattr(self, name, enabled)

    @contextmanager
    def optimizations(self, enabled: bool) -> Iterator[None]:
        """Temporarily turn every program-level optimisation on or off."""
        saved = {name: getattr(self, name) for name in OPTIMIZATION_FLAGS}
        self.set_optimizations(enabled)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)


global_config = GlobalConfig()
