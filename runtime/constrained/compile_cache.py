"""Compiled-grammar cache keyed by (kind, spec), bounded by memory (scheduler process).

Requests with the same spec share one compile, even while it is still running (single flight:
a timeout or an error reaches every request waiting on it). Only successes stay cached: a failed
compile is dropped so the next request gets a fresh attempt and its own error. The cache is an
LRU bounded by the bytes its compiled grammars hold (xgrammar reports its own size; other
backends give an estimate); in-flight compiles are never evicted, and a grammar larger than the
whole budget is still handed to its requests, just not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

GrammarKey = tuple[str, str]


class CompileCache:
    """Thread-safe: `get` runs on the scheduler thread, done callbacks on the compile threads."""

    def __init__(
        self,
        start_compile: Callable[[GrammarKey], Future[Any]],
        size_of: Callable[[Any], int],
        max_bytes: int,
    ) -> None:
        self._start_compile = start_compile
        self._size_of = size_of
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[GrammarKey, Future[Any]] = OrderedDict()
        self._sizes: dict[GrammarKey, int] = {}  # done entries only
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.evictions = 0

    def get(self, key: GrammarKey) -> Future[Any]:
        """The (possibly still running) compile of `key`; starts one on a miss."""
        with self._lock:
            future = self._entries.get(key)
            if future is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return future
            self.misses += 1
            future = self._start_compile(key)
            self._entries[key] = future
        future.add_done_callback(lambda f: self._on_done(key, f))
        return future

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def _on_done(self, key: GrammarKey, future: Future[Any]) -> None:
        failed = future.cancelled() or future.exception() is not None
        size = 0 if failed else self._size_of(future.result())
        with self._lock:
            if failed:
                self.errors += 1
                if self._entries.get(key) is future:
                    del self._entries[key]
                return
            if self._entries.get(key) is not future:
                return
            self._sizes[key] = size
            self.bytes += size
            self._evict_locked()

    def _evict_locked(self) -> None:
        """Drop the least recently used finished grammars until the cache fits its budget."""
        while self.bytes > self.max_bytes:
            victim = next((k for k in self._entries if k in self._sizes), None)
            if victim is None:
                return
            del self._entries[victim]
            self.bytes -= self._sizes.pop(victim)
            self.evictions += 1
