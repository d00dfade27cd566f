"""The `/hicache` route's view of one scheduler replica: its cache tiers (the KV pool's radix
tree, the host tier, the file tier) with capacities, use and the prompt tokens each served.

Runs in the API process; it only reshapes the replica's `internal_state()` (the scheduler's
`host_*` / `storage_*` counters), so the route costs one control round trip like /server_info.
"""

from __future__ import annotations

from radixgen.io_struct import InternalState


def hicache_tiers(state: InternalState) -> dict[str, object]:
    """{device, host?, storage?} of one replica's internal state."""
    host_hits = int(state.get("host_cached_tokens", 0))
    storage_hits = int(state.get("storage_cached_tokens", 0))
    tiers: dict[str, object] = {
        "device": {
            "capacity_tokens": state.get("max_total_num_tokens"),
            "used_tokens": state.get("kv_used_tokens"),
            "cached_tokens": int(state.get("cache_evictable_tokens", 0))
            + int(state.get("cache_protected_tokens", 0)),
            "hit_tokens": int(state.get("cached_tokens", 0)) - host_hits - storage_hits,
            "evicted_tokens": state.get("evicted_tokens", 0),
        }
    }
    if "host_capacity_tokens" in state:
        tiers["host"] = {
            "capacity_tokens": state["host_capacity_tokens"],
            "used_tokens": state["host_used_tokens"],
            "pinned_tokens": state["host_pinned_tokens"],
            "block_tokens": state["host_block_tokens"],
            "hit_tokens": host_hits,
            "stored_blocks": state["host_stored_blocks"],
            "evicted_blocks": state["host_evicted_blocks"],
        }
    if "storage_capacity_bytes" in state:
        tiers["storage"] = {
            "capacity_bytes": state["storage_capacity_bytes"],
            "used_bytes": state["storage_used_bytes"],
            "blocks": state["storage_blocks"],
            "hit_tokens": storage_hits,
            "stored_blocks": state["storage_stored_blocks"],
            "evicted_blocks": state["storage_evicted_blocks"],
            "bad_entries": state["storage_bad_entries"],
        }
    return tiers
