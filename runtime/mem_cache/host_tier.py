"""The host tier of the hierarchical prefix cache (`--enable-hierarchical-cache`): KV blocks
evicted from the pool, kept in host memory under their own capacity and LRU.

Runs in the scheduler process. On a CPU machine the pool itself lives in RAM, so this tier is
worth having because it is bounded separately (`--hicache-ratio` / `--hicache-size`) and holds
what the pool had to drop: a prefix evicted under memory pressure is copied back into fresh pool
pages instead of being prefilled again. Blocks are keyed by `prefix_hash.chain_hashes`, stored at
the pool's own KV dtype (exact: a block comes back bit for bit).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radixgen.runtime.mem_cache.host_codec import HostCompression
from radixgen.runtime.mem_cache.memory_pool import KVBlock


@dataclass
class TierStats:
    """Counters of one tier since start (the /hicache route and the scheduler's state)."""

    stored_blocks: int = 0  # blocks written into the tier
    evicted_blocks: int = 0  # blocks dropped by the tier's own LRU
    hit_blocks: int = 0  # blocks read back into the pool
    hit_tokens: int = 0  # tokens of those blocks that a request reused


class HostKVTier:
    """Up to `capacity_blocks` blocks of `block_tokens` tokens each, least recently used out first.

    Pinned blocks (a request's `pin_prefix` hint) are kept apart from the LRU: they leave only
    when every unpinned block is gone and the tier still needs room (the oldest pin first), or
    on a flush. Both orders are OrderedDicts, so each put / get stays O(1)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_tokens: int,
        on_drop: Callable[[bytes, KVBlock], None] | None = None,
        compression: HostCompression | None = None,
    ) -> None:
        self.capacity_blocks = max(0, capacity_blocks)
        self.block_tokens = block_tokens
        # called with each block the LRU drops (write-back to the file tier)
        self.on_drop = on_drop
        # blocks kept compressed (--hicache-host-kv-dtype); None: exactly as the pool stores them
        self.compression = compression
        self._blocks: OrderedDict[bytes, KVBlock] = OrderedDict()
        self._pinned: OrderedDict[bytes, KVBlock] = OrderedDict()  # in the order they were pinned
        self.stats = TierStats()

    def __len__(self) -> int:
        return len(self._blocks) + len(self._pinned)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks or key in self._pinned

    def used_tokens(self) -> int:
        return len(self) * self.block_tokens

    def pinned_tokens(self) -> int:
        return len(self._pinned) * self.block_tokens

    def capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_tokens

    def touch(self, key: bytes) -> bool:
        """Mark a block recently used; False if the tier does not hold it."""
        if key in self._pinned:
            return True
        if key not in self._blocks:
            return False
        self._blocks.move_to_end(key)
        return True

    def pin(self, key: bytes) -> bool:
        """Pin a block the tier holds in place; False if it does not hold it."""
        if key in self._pinned:
            return True
        if key not in self._blocks:
            return False
        self._pinned[key] = self._blocks.pop(key)
        return True

    def put(self, key: bytes, block: KVBlock, pinned: bool = False) -> None:
        """Keep `block` (evicting the least recently used blocks beyond the capacity); `pinned`
        keeps it out of the LRU (a block already held is pinned in place)."""
        if self.capacity_blocks == 0:
            return
        if (pinned and self.pin(key)) or self.touch(key):
            return
        while len(self) >= self.capacity_blocks:
            self._drop_one()
        stored = block if self.compression is None else self.compression.compress(block)
        (self._pinned if pinned else self._blocks)[key] = stored
        self.stats.stored_blocks += 1

    def _drop_one(self) -> None:
        order = self._blocks if self._blocks else self._pinned
        old_key, old_block = order.popitem(last=False)
        self.stats.evicted_blocks += 1
        if self.on_drop is not None:
            self.on_drop(old_key, self._out(old_block))

    def get(self, key: bytes) -> KVBlock | None:
        """The block, marked recently used, or None."""
        block = self._pinned.get(key)
        if block is None:
            block = self._blocks.get(key)
            if block is None:
                return None
            self._blocks.move_to_end(key)
        return self._out(block)

    def _out(self, block: KVBlock) -> KVBlock:
        return block if self.compression is None else self.compression.decompress(block)

    def clear(self) -> None:
        self._blocks.clear()
        self._pinned.clear()
