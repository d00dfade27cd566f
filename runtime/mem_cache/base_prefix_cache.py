"""The prefix-cache contract the scheduler programs against (radix tree or plain chunk cache)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.internal_state import CacheTierState

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.radix_cache import TreeNode
    from radixgen.runtime.scheduler.req import Req


@dataclass
class MatchResult:
    """KV slots of the longest cached prefix of a key, and the node to lock while using them."""

    indices: torch.Tensor
    last_node: TreeNode | None  # None: nothing to lock (no radix tree)
    # of `indices`, the tokens just copied back into the pool from the host tier; the rest
    # were in the pool already (or came from the file tier)
    host_tokens: int = 0
    storage_tokens: int = 0  # likewise, from the file tier


class BasePrefixCache(ABC):
    """Owns KV slots of finished prefixes and hands them to new requests.

    Accounting invariant (checked in debug mode): every allocated KV slot is either held by a
    running request (protected), or by the cache (evictable when no request locks it), never both.
    """

    @abstractmethod
    def match_prefix(self, key: list[int], namespace: str | None = None) -> MatchResult:
        """The longest cached prefix of `key` computed under `namespace` (a LoRA adapter's
        name; None: the base model): KV of one namespace is never served to another."""

    def match_and_load(self, key: list[int], namespace: str | None = None) -> MatchResult:
        """`match_prefix` for an admission: a cache with lower tiers first copies back what
        they hold of the key's continuation (into fresh pool pages, owned by the cache)."""
        return self.match_prefix(key, namespace)

    @abstractmethod
    def inc_lock_ref(self, node: TreeNode | None) -> None: ...

    @abstractmethod
    def dec_lock_ref(self, node: TreeNode | None) -> None: ...

    @abstractmethod
    def cache_finished_req(self, req: Req) -> None:
        """Hand a finished (or aborted) request's KV over to the cache; free its request slot."""

    @abstractmethod
    def cache_unfinished_req(self, req: Req, length: int | None = None) -> None:
        """After a prefill chunk: share what is computed so far (the first `length` tokens,
        default `kv_len`: under overlap a later step's tokens may already count there); update
        the request's prefix."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` of unlocked cache (LRU) if possible; return tokens freed."""

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def reset(self) -> None: ...

    def flush(self, keep_lower_tiers: bool = False) -> None:
        """Empty the cache (`/flush_cache`); a cache with lower tiers keeps them if asked."""
        self.reset()

    def record_hit(self, node: TreeNode | None) -> None:
        """A request was admitted reusing the prefix ending at `node` (hit counts, if kept)."""
        return None  # only the radix tree keeps hit counts

    def tier_state(self) -> CacheTierState:
        """Lower cache tiers' capacities, use and counters (none without HiCache)."""
        return CacheTierState()

    def cached_slots(self) -> list[torch.Tensor]:
        """Every KV slot the cache holds (debug accounting)."""
        return []

    @abstractmethod
    def check_invariants(self) -> None:
        """Debug: the cache's own bookkeeping is consistent (raises AssertionError if not)."""
