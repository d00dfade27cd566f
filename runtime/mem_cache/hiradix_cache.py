"""The radix tree over lower cache tiers (`--enable-hierarchical-cache`, SGLang's HiCache): what
the pool evicts is copied to a host tier first (and to a file tier on disk with
`--hicache-storage-backend file`), and an admission whose prefix continues into blocks of those
tiers gets them copied back into fresh pool pages instead of prefilling them again.

Runs in the scheduler process. The tree itself is the plain `RadixCache` (same locking, same
eviction order, same slot ownership): the lower tiers hold copies keyed by the hash chain of the
page-aligned token prefix (`prefix_hash.py`), never pool slots, so the KV accounting of the pool
is unchanged, and blocks that come back are ordinary tree nodes owned by the cache. A LoRA
adapter's tree (its namespace, the adapter's content digest) seeds its chains with that digest,
so its blocks never meet another adapter's or the base model's, and come back after a restart. Only whole
blocks of `block_tokens` (a multiple of the page) are kept: the tail of a leaf shorter than a
block is dropped as before.

When the file tier is written (`--hicache-write-policy`, SGLang's names):
- `write_through`: every block as soon as the tree takes it (a prefill's KV is on disk before
  any restart, at the cost of a write per new block);
- `write_through_selective`: a block when the pool evicts it (what was worth caching and had to
  leave the pool);
- `write_back`: a block when the host tier drops it (the disk holds what the host tier cannot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixgen.internal_state import CacheTierState, HostTierState, StorageTierState
from radixgen.runtime.mem_cache.base_prefix_cache import MatchResult
from radixgen.runtime.mem_cache.file_tier import FileKVTier
from radixgen.runtime.mem_cache.host_tier import HostKVTier
from radixgen.runtime.mem_cache.memory_pool import KVBlock, ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.prefix_hash import chain_hashes
from radixgen.runtime.mem_cache.radix_cache import RadixCache, TreeNode

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.req import Req

HOST_BLOCK_MIN_TOKENS = 16  # per-token host entries would cost a hash and a dict entry each
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")


def chain_seed(namespace: str | None) -> bytes:
    """The seed of a tree's hash chains: none for the base model's, the namespace (a LoRA
    adapter's content digest) for an adapter's."""
    return b"" if namespace is None else namespace.encode()


def host_block_tokens(page_size: int) -> int:
    """The lower tiers' block: the smallest multiple of the page of at least 16 tokens."""
    return page_size * -(-HOST_BLOCK_MIN_TOKENS // page_size)


class HiRadixCache(RadixCache):
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        page_size: int,
        host: HostKVTier,
        files: FileKVTier | None = None,
        write_policy: str = "write_through",
    ) -> None:
        assert host.block_tokens % page_size == 0, "host blocks must be whole pages"
        assert write_policy in WRITE_POLICIES, write_policy
        # NOTE: RadixCache.__init__ calls reset(), which empties the lower tiers: the file
        # tier is attached after it (what a previous run left on disk is to be served)
        self.host = host
        self.files: FileKVTier | None = None
        self.write_policy = write_policy
        super().__init__(req_to_token_pool, kv_pool, page_size)
        self.files = files
        self._backup_leaf = self._backup
        if files is not None and write_policy == "write_back":
            host.on_drop = files.put
        k = kv_pool.k_buffer
        raw = torch.uint8 if k.dtype == torch.float8_e4m3fn else k.dtype
        # what a block read back must look like (a file written for other KV never loads)
        self._block_shape = (k.shape[0], host.block_tokens, k.shape[2], k.shape[3])
        self._block_dtype = raw

    def reset(self, keep_lower_tiers: bool = False) -> None:
        """Empty the tree (its slots are the pool's again), and the lower tiers unless asked."""
        super().reset()
        if not keep_lower_tiers:
            self.host.clear()
            if self.files is not None:
                self.files.clear()

    def flush(self, keep_lower_tiers: bool = False) -> None:
        self.reset(keep_lower_tiers)

    def _path(self, node: TreeNode) -> tuple[list[int], torch.Tensor, bytes]:
        """The tokens and pool slots from its tree's root to the end of `node`, and the seed of
        that tree's hash chains."""
        nodes: list[TreeNode] = []
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        tokens = [t for n in nodes for t in n.key]
        namespace = next(ns for ns, root in self.roots.items() if root is node)
        return tokens, torch.cat([n.value for n in nodes]), chain_seed(namespace)

    def _backup(self, leaf: TreeNode) -> None:
        """Copy the whole blocks that end inside `leaf` to the lower tiers (a block's head may
        lie in the leaf's ancestors, which stay in the pool)."""
        tokens, slots, seed = self._path(leaf)
        b = self.host.block_tokens
        first = (len(tokens) - len(leaf.key)) // b
        last = len(tokens) // b  # exclusive
        files = self.files
        to_files = files is not None and (
            self.write_policy == "write_through_selective"
            or (self.write_policy == "write_back" and self.host.capacity_blocks == 0)
        )
        if first >= last or (self.host.capacity_blocks == 0 and not to_files):
            return
        for k, h in enumerate(chain_hashes(tokens[: last * b], b, seed)):
            if k < first:
                continue
            in_host = self.host.touch(h)
            in_files = not to_files or (files is not None and h in files)
            if in_host and in_files:
                continue
            block = self.kv_pool.read_slots(slots[k * b : (k + 1) * b])
            if not in_host:
                self.host.put(h, block)
            if not in_files and files is not None:
                files.put(h, block)

    def insert(self, key: list[int], value: torch.Tensor, namespace: str | None = None) -> int:
        already = super().insert(key, value, namespace)
        if self.files is not None and self.write_policy == "write_through":
            self._write_through(key, value, chain_seed(namespace))
        return already

    def cache_finished_req(self, req: Req) -> None:
        prompt = req.origin_input_ids
        super().cache_finished_req(req)
        if req.pin_prefix:
            self.pin(prompt, req.cache_namespace)

    def pin(self, key: list[int], namespace: str | None = None) -> int:
        """Copy the whole blocks of `key` the tree holds to the host tier, pinned (and to the
        file tier if it lacks them, whatever the write policy): a prefix hint says this prefix
        comes back. Returns the tokens pinned."""
        b = self.host.block_tokens
        match = self.match_prefix(key[: len(key) // b * b], namespace)
        n = match.indices.numel() // b * b
        files = self.files
        for k, h in enumerate(chain_hashes(key[:n], b, chain_seed(namespace))):
            held = self.host.pin(h)
            on_disk = files is None or h in files
            if held and on_disk:
                continue
            block = self.kv_pool.read_slots(match.indices[k * b : (k + 1) * b])
            if not held:
                self.host.put(h, block, pinned=True)
            if files is not None and not on_disk:
                files.put(h, block)
        return n

    def _write_through(self, key: list[int], value: torch.Tensor, seed: bytes) -> None:
        """Write the inserted key's whole blocks the file tier lacks (the caller's slots still
        hold their KV: duplicates are freed only after the insert)."""
        files = self.files
        assert files is not None
        b = self.host.block_tokens
        for k, h in enumerate(chain_hashes(key, b, seed)):
            if h not in files:
                files.put(h, self.kv_pool.read_slots(value[k * b : (k + 1) * b]))

    def _lower_block(self, h: bytes) -> tuple[KVBlock | None, bool]:
        """The block keyed `h` from the host tier, else the file tier (then kept in the host
        tier too); and whether it came from the file tier."""
        block = self.host.get(h)
        if block is not None or self.files is None:
            return block, False
        block = self.files.get(h)
        if block is None:
            return None, False
        if tuple(block.k.shape) != self._block_shape or block.k.dtype != self._block_dtype:
            return None, False  # written for another layout: recompute
        self.host.put(h, block)
        return block, True

    def match_and_load(self, key: list[int], namespace: str | None = None) -> MatchResult:
        key = key[: self._aligned(len(key))]
        dev = self.match_prefix(key, namespace)
        start = dev.indices.numel()
        b = self.host.block_tokens
        if not (len(self.host) or self.files) or len(key) - start < b:
            return dev
        first = start // b
        blocks: list[KVBlock] = []
        from_files: list[bool] = []
        for k, h in enumerate(chain_hashes(key, b, chain_seed(namespace))):
            if k < first:
                continue
            block, on_disk = self._lower_block(h)
            if block is None:
                break
            blocks.append(block)
            from_files.append(on_disk)
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
        already = self.insert(key[: start + n], torch.cat([dev.indices, slots]), namespace)
        assert already == start, "the tree changed between the match and the load"
        storage = 0
        for i, on_disk in enumerate(from_files):  # tokens [offset, offset + n) of the blocks
            used = max(0, min((i + 1) * b, offset + n) - max(i * b, offset))
            if on_disk:
                storage += used
        used_blocks = -(-(offset + n) // b)
        self.host.stats.hit_blocks += used_blocks - sum(from_files[:used_blocks])
        self.host.stats.hit_tokens += n - storage
        if self.files is not None:
            self.files.stats.hit_blocks += sum(from_files[:used_blocks])
            self.files.stats.hit_tokens += storage
        loaded = self.match_prefix(key, namespace)
        return MatchResult(
            loaded.indices, loaded.last_node, host_tokens=n - storage, storage_tokens=storage
        )

    def tier_state(self) -> CacheTierState:
        """Capacities, use and counters of the lower tiers (tokens, blocks, bytes)."""
        st = self.host.stats
        host = HostTierState(
            host_capacity_tokens=self.host.capacity_tokens(),
            host_used_tokens=self.host.used_tokens(),
            host_pinned_tokens=self.host.pinned_tokens(),
            host_block_tokens=self.host.block_tokens,
            host_stored_blocks=st.stored_blocks,
            host_evicted_blocks=st.evicted_blocks,
            host_hit_blocks=st.hit_blocks,
            host_hit_tokens=st.hit_tokens,
        )
        if self.files is None:
            return CacheTierState(host=host)
        fs = self.files.stats
        storage = StorageTierState(
            storage_capacity_bytes=self.files.capacity_bytes,
            storage_used_bytes=self.files.used_bytes,
            storage_blocks=len(self.files),
            storage_stored_blocks=fs.stored_blocks,
            storage_evicted_blocks=fs.evicted_blocks,
            storage_hit_blocks=fs.hit_blocks,
            storage_hit_tokens=fs.hit_tokens,
            storage_bad_entries=self.files.bad_entries,
        )
        return CacheTierState(host=host, storage=storage)
