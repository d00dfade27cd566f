"""The data-parallel routing policies and the replicas' approximate prefix trees, as plain logic."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.request_side.load_balance import (
    CacheAwareConfig,
    LoadBalancer,
    PrefixTree,
)

prompts = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=12), min_size=1, max_size=20)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=200, deadline=None)
@given(inserted=prompts, probe=st.lists(st.integers(0, 5), max_size=12))
def test_tree_matches_the_longest_prefix_of_anything_inserted(inserted, probe):
    tree = PrefixTree()
    for ids in inserted:
        tree.insert(ids)
    assert tree.match(probe) == max(common_prefix(ids, probe) for ids in inserted)
    # the size counts each distinct prefix token once: the number of distinct non-empty prefixes
    assert tree.size == len({tuple(ids[: k + 1]) for ids in inserted for k in range(len(ids))})


@settings(max_examples=200, deadline=None)
@given(inserted=prompts, limit=st.integers(0, 30))
def test_eviction_bounds_the_size_and_keeps_the_newest_prompt(inserted, limit):
    tree = PrefixTree()
    for ids in inserted:
        tree.insert(ids)
    tree.evict(limit)
    assert tree.size <= max(limit, 0)
    if len(inserted[-1]) <= limit:
        assert tree.match(inserted[-1]) == len(inserted[-1])  # least recently used goes first


def test_round_robin_cycles_whatever_the_loads():
    lb = LoadBalancer("round_robin", 3)
    assert [lb.choose([1], [9, 0, 0]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    assert LoadBalancer("auto", 2).method == "round_robin"


def test_shortest_queue_takes_the_fewest_in_flight_and_rotates_ties():
    lb = LoadBalancer("shortest_queue", 3)
    assert lb.choose([1], [2, 0, 1]) == 1
    assert lb.choose([1], [0, 0, 0]) == 2  # ties rotate from after the last choice
    assert lb.choose([1], [0, 0, 0]) == 0


def test_cache_aware_follows_the_longest_prefix_and_spreads_new_ones():
    lb = LoadBalancer("cache_aware", 2)
    a, b = list(range(100, 120)), list(range(200, 220))
    first = lb.choose(a, [0, 0])
    other = lb.choose(b, [0, 0])  # no match: the replica with fewer cached tokens
    assert other != first
    assert lb.choose([*a, 1, 2], [0, 0]) == first
    assert lb.choose([*b, 3], [0, 0]) == other


def test_cache_aware_below_the_threshold_goes_to_the_least_loaded():
    lb = LoadBalancer("cache_aware", 2, CacheAwareConfig(cache_threshold=0.5))
    a = list(range(10))
    home = lb.choose(a, [0, 0])
    loads = [0, 0]
    loads[home] = 1
    # 3 of 10 tokens shared (0.3 <= 0.5): not worth the busier replica
    assert lb.choose([0, 1, 2, 50, 51, 52, 53, 54, 55, 56], loads) == 1 - home
    assert lb.choose([*a, 11], loads) == home  # 10 of 11 shared: follows the cache


def test_cache_aware_imbalance_sends_to_the_least_loaded_and_still_records_the_prompt():
    cfg = CacheAwareConfig(balance_abs_threshold=4, balance_rel_threshold=1.5)
    lb = LoadBalancer("cache_aware", 2, cfg)
    a = list(range(30))
    home = lb.choose(a, [0, 0])
    loads = [0, 0]
    loads[home] = 4  # difference 4: not above the threshold
    assert lb.choose(a, loads) == home
    loads[home] = 5
    away = lb.choose(a, loads)
    assert away == 1 - home
    assert lb.trees[away].match(a) == len(a)
    loads[1 - home] = 3  # 5 vs 3: difference within bounds again, both hold it: least loaded
    assert lb.choose(a, loads) == 1 - home


def test_cache_aware_random_traffic_keeps_trees_bounded():
    cfg = CacheAwareConfig(max_tree_tokens=50)
    lb = LoadBalancer("cache_aware", 3, cfg)
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 20))]
        lb.choose(ids, [rng.randrange(3) for _ in range(3)])
    assert all(tree.size <= 50 for tree in lb.trees)


def test_unknown_method_is_an_error():
    with pytest.raises(ValueError, match="total_tokens"):
        LoadBalancer("total_tokens", 2)
