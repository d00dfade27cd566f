"""Compiled-grammar cache keyed by (kind, spec), compiling on a worker pool (scheduler process).

Requests with the same spec share one compile, even while it is still running. Only successes
stay cached: a failed compile is dropped so the next request gets a fresh attempt and its own
error. The cache is an LRU bounded by entry count; in-flight compiles are never evicted.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

GrammarKey = tuple[str, str]


class CompileCache:
    """Thread-safe: `get` runs on the scheduler thread, compile callbacks on the workers."""

    def __init__(
        self, compile_fn: Callable[[str, str], Any], executor: Executor, max_entries: int
    ) -> None:
        self._compile_fn = compile_fn
        self._executor = executor
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[GrammarKey, Future] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.compiles = 0
        self.errors = 0
        self.compile_seconds = 0.0
        self.max_compile_seconds = 0.0

    def get(self, key: GrammarKey) -> Future:
        """The (possibly still running) compile of `key`; starts one on a miss."""
        with self._lock:
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return future
            self.misses += 1
            future = self._executor.submit(self._timed_compile, key)
            self._entries[key] = future
            self._evict_locked()
        future.add_done_callback(lambda f: self._on_done(key, f))
        return future

    def __len__(self) -> int:
        return len(self._entries)

    def _timed_compile(self, key: GrammarKey) -> Any:
        start = time.perf_counter()
        try:
            return self._compile_fn(*key)
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self.compiles += 1
                self.compile_seconds += elapsed
                self.max_compile_seconds = max(self.max_compile_seconds, elapsed)

    def _on_done(self, key: GrammarKey, future: Future) -> None:
        if future.cancelled() or future.exception() is not None:
            with self._lock:
                self.errors += 1
                if self._entries.get(key) is future:
                    del self._entries[key]

    def _evict_locked(self) -> None:
        excess = len(self._entries) - self._max_entries
        if excess <= 0:
            return
        for key in [k for k, f in self._entries.items() if f.done()][:excess]:
            del self._entries[key]
