"""Hit counts on radix nodes and the dashboard's bounded tree picture (no model, no server)."""

from __future__ import annotations

import torch

from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.radix_cache import RadixCache
from radixgen.runtime.mem_cache.tree_snapshot import PREVIEW_TOKENS, snapshot_tree


def _cache() -> RadixCache:
    pool = TokenToKVPool(256, 1, 1, 1, 2, torch.float32)
    return RadixCache(ReqToTokenPool(4, 64), pool)


def _insert(cache: RadixCache, key: list[int]) -> None:
    slots = cache.kv_pool.alloc(len(key))
    assert slots is not None
    already = cache.insert(key, slots)
    cache.kv_pool.free(slots[:already])


def test_hits_count_admissions_and_survive_splits() -> None:
    cache = _cache()
    shared = list(range(10))
    _insert(cache, [*shared, 100, 101])
    match = cache.match_prefix([*shared, 200])  # splits the node after the shared prefix
    cache.record_hit(match.last_node)
    cache.record_hit(cache.match_prefix([*shared, 300]).last_node)
    _insert(cache, [*shared, 200, 201])
    views, truncated = snapshot_tree(cache, 10)
    assert not truncated
    by_prefix = {v.prefix_tokens: v for v in views}
    top = by_prefix[10]
    assert (top.parent, top.tokens, top.hits, top.children) == (-1, 10, 2, 2)
    assert top.preview_ids == shared
    leaves = [v for v in views if v.parent == top.id]
    assert sorted(v.tokens for v in leaves) == [2, 2] and all(v.hits == 0 for v in leaves)


def test_snapshot_is_capped_connected_and_says_what_it_left_out() -> None:
    cache = _cache()
    for i in range(6):
        _insert(cache, [1, 2, 3, 10 + i] + [7] * (i + 1) * 5)
    _insert(cache, list(range(40, 40 + PREVIEW_TOKENS + 5)))
    views, truncated = snapshot_tree(cache, 4)
    assert truncated and len(views) == 4
    ids = {v.id for v in views}
    assert all(v.parent == -1 or v.parent in ids for v in views)  # the top of the tree
    assert sum(v.hidden_children for v in views) >= 3
    long = [v for v in views if v.tokens > PREVIEW_TOKENS]
    assert long and all(v.preview_truncated and len(v.preview_ids) == PREVIEW_TOKENS for v in long)
