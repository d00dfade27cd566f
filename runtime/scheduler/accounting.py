"""Debug accounting of KV slots (scheduler process, `debug_invariants` mode and tests).

Every slot of the pool is exactly one of: free, held by the prefix cache, or owned by a running
request; the cache's evictable + protected sizes equal what its nodes hold.
"""

from __future__ import annotations

from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.scheduler.req import Req


def check_kv_accounting(
    kv_pool: TokenToKVPool,
    cache: BasePrefixCache,
    req_to_token_pool: ReqToTokenPool,
    running: list[Req],
) -> None:
    """Free + cached + request-owned slots cover the pool exactly once (debug mode, tests)."""
    free = kv_pool.free_slot_set()
    owned: list[int] = []
    for tensor in cache.cached_slots():
        owned.extend(tensor.tolist())
    for r in running:
        assert r.req_pool_idx is not None
        own = req_to_token_pool.req_to_token[r.req_pool_idx, r.cache_protected_len : r.kv_len]
        owned.extend(own.tolist())
        if kv_pool.page_size > 1 and own.numel():  # a request owns its last page whole
            last = int(own[-1])
            page_start = last - last % kv_pool.page_size
            owned.extend(s for s in range(page_start, page_start + kv_pool.page_size) if s > last)
    owned_set = set(owned)
    assert len(owned_set) == len(owned), "a KV slot is owned twice"
    assert not (owned_set & free), "a KV slot is both free and in use"
    total = len(free) + len(owned_set)
    assert total == kv_pool.size, (
        f"KV accounting: {len(free)} free + {len(owned_set)} used != {kv_pool.size}"
    )
    cache.check_invariants()
    cache_total = cache.evictable_size() + cache.protected_size()
    assert cache_total == sum(t.numel() for t in cache.cached_slots())
