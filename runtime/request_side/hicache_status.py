"""The `/hicache` route's view of one scheduler replica: its cache tiers (the KV pool's radix
tree, the host tier, the file tier) with capacities, use and the prompt tokens each served.

Runs in the API process; it only reshapes the replica's `internal_state()` (the scheduler's
`host_*` / `storage_*` counters), so the route costs one control round trip like /server_info.
"""

from __future__ import annotations

from radixgen.internal_state import InternalState, SchedulerState


def hicache_tiers(state: InternalState) -> dict[str, object]:
    """{device, host?, storage?} of one replica's internal state."""
    if not isinstance(state, SchedulerState):  # an embedding server: no KV pool, no tiers
        empty = ("cached_tokens", "hit_tokens", "evicted_tokens")
        device = {"capacity_tokens": None, "used_tokens": None, **dict.fromkeys(empty, 0)}
        return {"device": device}
    counters, host, storage = state.counters, state.tiers.host, state.tiers.storage
    host_hits, storage_hits = counters.host_cached_tokens, counters.storage_cached_tokens
    tiers: dict[str, object] = {
        "device": {
            "capacity_tokens": state.kv_pool.max_total_num_tokens,
            "used_tokens": state.kv_pool.kv_used_tokens,
            "cached_tokens": state.prefix_cache.cache_evictable_tokens
            + state.prefix_cache.cache_protected_tokens,
            "hit_tokens": counters.cached_tokens - host_hits - storage_hits,
            "evicted_tokens": counters.evicted_tokens,
        }
    }
    if host is not None:
        tiers["host"] = {
            "capacity_tokens": host.host_capacity_tokens,
            "used_tokens": host.host_used_tokens,
            "pinned_tokens": host.host_pinned_tokens,
            "block_tokens": host.host_block_tokens,
            "hit_tokens": host_hits,
            "stored_blocks": host.host_stored_blocks,
            "evicted_blocks": host.host_evicted_blocks,
        }
    if storage is not None:
        tiers["storage"] = {
            "capacity_bytes": storage.storage_capacity_bytes,
            "used_bytes": storage.storage_used_bytes,
            "blocks": storage.storage_blocks,
            "hit_tokens": storage_hits,
            "stored_blocks": storage.storage_stored_blocks,
            "evicted_blocks": storage.storage_evicted_blocks,
            "bad_entries": storage.storage_bad_entries,
        }
    return tiers
