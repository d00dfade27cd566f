"""A request can hold KV past its known tokens when it is released: under overlap scheduling the
step after the one that failed was already launched for a token that never arrived. Releasing it
must cache its known tokens only and give every other slot back (radix cache, pages of 1 and 4)."""

from __future__ import annotations

import pytest
from req_helpers import make_pools, make_req

from radixgen.runtime.mem_cache.radix_cache import RadixCache


@pytest.mark.parametrize("page_size", [1, 4])
def test_slots_past_the_known_tokens_are_freed_not_cached(page_size: int) -> None:
    rows, pool = make_pools(64, page_size=page_size)
    cache = RadixCache(rows, pool, page_size)
    req = make_req("r", [3, 1, 4, 1, 5, 9, 2, 6])
    req.output_ids = [5, 3, 5]  # 11 known tokens
    held = 12  # one more: KV of a token that never arrived
    row = rows.alloc()
    assert row is not None
    slots = pool.alloc_extend([0], [held], [-1]) if page_size > 1 else pool.alloc(held)
    assert slots is not None
    rows.write_row(row, 0, slots)
    match = cache.match_prefix([])  # admitted with nothing cached: the root, locked
    cache.inc_lock_ref(match.last_node)
    req.req_pool_idx, req.kv_len, req.last_node = row, held, match.last_node
    cache.cache_finished_req(req)
    cached = cache.evictable_size()
    assert cached == 11 // page_size * page_size  # the known tokens' whole pages
    assert pool.available_size() + cached == pool.size  # nothing leaked
    assert cache.match_prefix([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 0]).indices.numel() == cached
    cache.check_invariants()
