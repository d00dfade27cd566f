"""The radix tree over a host tier (`--enable-hierarchical-cache`, SGLang's HiCache): what the
pool evicts is copied to host memory first, and an admission whose prefix continues into host
blocks gets them copied back into fresh pool pages instead of prefilling them again.

Runs in the scheduler process. The tree itself is the plain `RadixCache` (same locking, same
eviction order, same slot ownership): the host tier holds copies keyed by the hash chain of the
page-aligned token prefix (`prefix_hash.py`), never pool slots, so the KV accounting of the pool
is unchanged, and blocks that come back are ordinary tree nodes owned by the cache. Only whole
blocks of `block_tokens` (a multiple of the page) are kept: the tail of a leaf shorter than a
block is dropped as before.
"""

from __future__ import annotations

import torch

from radixgen.runtime.mem_cache.base_prefix_cache import MatchResult
from radixgen.runtime.mem_cache.host_tier import HostKVTier
from radixgen.runtime.mem_cache.memory_pool import KVBlock, ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.prefix_hash import chain_hashes
from radixgen.runtime.mem_cache.radix_cache import RadixCache, TreeNode

HOST_BLOCK_MIN_TOKENS = 16  # per-token host entries would cost a hash and a dict entry each


def host_block_tokens(page_size: int) -> int:
    """The host tier's block: the smallest multiple of the page of at least 16 tokens."""
    return page_size * -(-HOST_BLOCK_MIN_TOKENS // page_size)


class HiRadixCache(RadixCache):
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        page_size: int,
        host: HostKVTier,
    ) -> None:
        assert host.block_tokens % page_size == 0, "host blocks must be whole pages"
        self.host = host  # NOTE: before RadixCache.__init__, whose reset() clears it
        super().__init__(req_to_token_pool, kv_pool, page_size)
        self._backup_leaf = self._backup

    def reset(self, keep_lower_tiers: bool = False) -> None:
        """Empty the tree (its slots are the pool's again); the host tier too unless asked."""
        super().reset()
        if not keep_lower_tiers:
            self.host.clear()

    def _path(self, node: TreeNode) -> tuple[list[int], torch.Tensor]:
        """The tokens and pool slots from the root to the end of `node`."""
        nodes: list[TreeNode] = []
        while node is not self.root:
            nodes.append(node)
            assert node.parent is not None
            node = node.parent
        nodes.reverse()
        tokens = [t for n in nodes for t in n.key]
        return tokens, torch.cat([n.value for n in nodes])

    def _backup(self, leaf: TreeNode) -> None:
        """Copy the whole blocks that end inside `leaf` to the host tier (a block's head may lie
        in the leaf's ancestors, which stay in the pool)."""
        tokens, slots = self._path(leaf)
        b = self.host.block_tokens
        first = (len(tokens) - len(leaf.key)) // b
        last = len(tokens) // b  # exclusive
        if first >= last or self.host.capacity_blocks == 0:
            return
        for k, h in enumerate(chain_hashes(tokens[: last * b], b)):
            if k >= first and not self.host.touch(h):
                self.host.put(h, self.kv_pool.read_slots(slots[k * b : (k + 1) * b]))

    def match_and_load(self, key: list[int]) -> MatchResult:
        key = key[: self._aligned(len(key))]
        dev = self.match_prefix(key)
        start = dev.indices.numel()
        b = self.host.block_tokens
        if not len(self.host) or len(key) - start < b:
            return dev
        first = start // b
        blocks: list[KVBlock] = []
        for k, h in enumerate(chain_hashes(key, b)):
            if k < first:
                continue
            block = self.host.get(h)
            if block is None:
                break
            blocks.append(block)
        if not blocks:
            return dev
        n = (first + len(blocks)) * b - start
        self.inc_lock_ref(dev.last_node)  # making room must not evict the prefix we extend
        try:
            free = self.kv_pool.available_size()
            if free < n:
                self.evict(n - free)
                free = self.kv_pool.available_size()
        finally:
            self.dec_lock_ref(dev.last_node)
        n = min(n, self._aligned(free))
        if n <= 0:
            return dev
        slots = self.kv_pool.alloc(n)
        assert slots is not None, "free pages were counted above"
        offset = start - first * b
        self.kv_pool.write_slots(slots, KVBlock.cat(blocks).tokens(offset, offset + n))
        already = self.insert(key[: start + n], torch.cat([dev.indices, slots]))
        assert already == start, "the tree changed between the match and the load"
        self.host.stats.hit_blocks += -(-(offset + n) // b)
        self.host.stats.hit_tokens += n
        loaded = self.match_prefix(key)
        return MatchResult(loaded.indices, loaded.last_node, host_tokens=n)

    def tier_state(self) -> dict[str, int]:
        """Capacities, use and counters of the host tier (tokens and blocks)."""
        st = self.host.stats
        return {
            "host_capacity_tokens": self.host.capacity_tokens(),
            "host_used_tokens": self.host.used_tokens(),
            "host_block_tokens": self.host.block_tokens,
            "host_stored_blocks": st.stored_blocks,
            "host_evicted_blocks": st.evicted_blocks,
            "host_hit_blocks": st.hit_blocks,
            "host_hit_tokens": st.hit_tokens,
        }
