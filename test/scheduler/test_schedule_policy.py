"""Waiting-queue order of each schedule policy on a hand-built radix tree (no model, no processes).

Expected orders are worked out by hand from the policies' definitions:
- fcfs: retracted requests first, then everyone by arrival time;
- lpm: retracted first (by arrival), then the longest cached prefix of `all_ids[:-1]` first (the
  last prompt token is always computed, so it never counts as matched), ties by arrival;
- dfs-weight: retracted first, then a depth-first walk of the tree from the root that enters the
  child with more waiting requests in its subtree first; the requests whose match ends at a node
  come (by arrival) before those below it.
"""

from __future__ import annotations

import pytest
from req_helpers import make_pools, make_req

from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
from radixgen.runtime.mem_cache.chunk_cache import ChunkCache
from radixgen.runtime.mem_cache.radix_cache import RadixCache
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.schedule_policy import order_waiting_queue


def _cache_with(keys: list[list[int]], page_size: int = 1) -> RadixCache:
    req_to_token, kv_pool = make_pools(256, page_size)
    cache = RadixCache(req_to_token, kv_pool, page_size)
    for key in keys:
        slots = kv_pool.alloc(len(key))
        assert slots is not None
        kv_pool.free(slots[: cache.insert(key, slots)])  # the part the tree already held
    return cache


# Cached: A = 1 2 3 4 5 6, B = 1 2 3 7 8, C = 9 9 9. The waiting requests' matches then split
# the tree (r2 cuts A after 1 2 3 4, r5 cuts 1 2 3 after 1 2) into:
#
#   root               <- r0 (no match)
#   |-- [1 2]          <- r5 (matches 1 2)
#   |   `-- [3]
#   |       |-- [4]    <- r2 (matches 1 2 3 4)
#   |       |   `-- [5 6]  <- r4 (matches 1 2 3 4 5 6)
#   |       `-- [7 8]  <- r1, r6, r10 (match 1 2 3 7 8)
#   `-- [9 9 9]        <- r3 (matches 9 9 9)
#
# Waiting requests per subtree: [7 8] 3, [4] 2 (r2, r4), [3] 5, [1 2] 6, [9 9 9] 1. So [1 2] is
# entered before [9 9 9] (the first-inserted child is the heavier one) and [7 8] before [4] (the
# later-inserted child is the heavier one): neither insertion order explains the result.
CACHED = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8], [9, 9, 9]]
PROMPTS = {  # rid -> (prompt ids, arrival time); the last id of each prompt is never matched
    "r0": ([5, 5, 5, 5], 0.0),  # match 0
    "r1": ([1, 2, 3, 7, 8, 0], 1.0),  # match 5
    "r2": ([1, 2, 3, 4, 0], 2.0),  # match 4
    "r3": ([9, 9, 9, 1], 3.0),  # match 3
    "r4": ([1, 2, 3, 4, 5, 6, 7], 4.0),  # match 6
    "r5": ([1, 2, 9, 9], 5.0),  # match 2
    "r6": ([1, 2, 3, 7, 8, 1, 1], 6.0),  # match 5
    "r10": ([1, 2, 3, 7, 8, 5, 5], 10.0),  # match 5
}
RETRACTED = {  # back in the queue after a retraction: always first, by arrival
    "r7": ([9, 9, 9, 9, 9], 0.5),
    "r8": ([1, 2, 3, 4, 5, 6, 7], 7.0),
}
QUEUE_ORDER = ["r6", "r3", "r8", "r0", "r5", "r10", "r2", "r7", "r4", "r1"]  # as they sit


def _queue() -> list[Req]:
    reqs = {rid: make_req(rid, ids, t) for rid, (ids, t) in {**PROMPTS, **RETRACTED}.items()}
    for rid in RETRACTED:
        reqs[rid].reset_for_retract()
    return [reqs[rid] for rid in QUEUE_ORDER]


def _order(policy: str, cache: BasePrefixCache | None = None, **kwargs: int) -> list[str]:
    cache = _cache_with(CACHED) if cache is None else cache
    return [r.rid for r in order_waiting_queue(_queue(), policy, cache, **kwargs)]


def test_fcfs_is_retracted_first_then_arrival_order():
    assert _order("fcfs") == ["r7", "r8", "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r10"]


def test_lpm_is_longest_cached_prefix_first_ties_by_arrival():
    assert _order("lpm") == ["r7", "r8", "r4", "r1", "r6", "r10", "r2", "r3", "r5", "r0"]


def test_dfs_weight_walks_heavier_subtrees_first():
    assert _order("dfs-weight") == ["r7", "r8", "r0", "r5", "r1", "r6", "r10", "r2", "r4", "r3"]


def test_lpm_never_counts_the_last_prompt_token_as_matched():
    cache = _cache_with([[1, 2, 3, 4, 5, 6]])
    whole = make_req("whole", [1, 2, 3, 4, 5, 6], 0.0)  # all cached: 5 matched, 1 to compute
    longer = make_req("longer", [1, 2, 3, 4, 5, 6, 0], 1.0)  # 6 matched
    order = order_waiting_queue([whole, longer], "lpm", cache)
    assert [r.rid for r in order] == ["longer", "whole"]


def test_lpm_compares_page_aligned_matches():
    cache = _cache_with([[1, 2, 3, 4]], page_size=2)
    reqs = [
        make_req("half_page", [1, 2, 3, 9], 0.0),  # 1 2 3 -> one whole page: 2
        make_req("aligned", [1, 2, 3, 4], 1.0),  # 1 2 3 (last id unmatched) -> 2
        make_req("two_pages", [1, 2, 3, 4, 5], 2.0),  # 1 2 3 4 -> 4
    ]
    order = order_waiting_queue(reqs, "lpm", cache)
    assert [r.rid for r in order] == ["two_pages", "half_page", "aligned"]


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policies_fall_back_to_fcfs_past_the_queue_limit(policy):
    fcfs = ["r7", "r8", "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r10"]
    assert _order(policy, max_policy_queue=len(QUEUE_ORDER) - 1) == fcfs
    # at the limit the policy still applies
    assert _order(policy, max_policy_queue=len(QUEUE_ORDER)) == _order(policy)
    assert _order(policy, max_policy_queue=len(QUEUE_ORDER)) != fcfs


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policies_are_fcfs_without_a_radix_cache(policy):
    chunk_cache = ChunkCache(*make_pools(256))
    assert _order(policy, chunk_cache) == _order("fcfs")


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown schedule policy"):
        _order("random")
