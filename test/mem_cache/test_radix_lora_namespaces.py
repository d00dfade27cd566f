"""The radix cache keyed by LoRA adapter: a prefix cached under one adapter (or the base model) is
never matched by another's request, requests of one adapter share it, and locking, eviction and
the KV accounting span every adapter's tree."""

from __future__ import annotations

import torch
from req_helpers import make_pools, make_req

from radixgen.io_struct import TokenizedGenerateReq
from radixgen.runtime.mem_cache.radix_cache import RadixCache
from radixgen.runtime.scheduler.req import Req
from radixgen.sampling_params import SamplingParams


def lora_req(rid: str, ids: list[int], lora: str | None) -> Req:
    msg = TokenizedGenerateReq(rid, list(ids), SamplingParams(), lora_path=lora)
    req = Req(msg, default_seed=0)
    req.cache_namespace = lora  # the scheduler sets the adapter's content digest
    return req


def test_prefixes_never_cross_adapters() -> None:
    rows, pool = make_pools(64)
    cache = RadixCache(rows, pool)
    key = [5, 6, 7, 8]
    base, a = pool.alloc(4), pool.alloc(4)
    assert cache.insert(key, base) == 0
    assert cache.insert(key, a, "a") == 0  # not a duplicate of the base's: a tree of its own
    assert cache.match_prefix(key).indices.tolist() == base.tolist()
    assert cache.match_prefix(key, "a").indices.tolist() == a.tolist()
    assert cache.match_prefix(key, "b").indices.numel() == 0
    assert cache.insert(key[:3], a[:3], "a") == 3  # the same adapter shares
    assert cache.evictable_size() == 8
    cache.check_invariants()


def test_locks_and_eviction_span_every_tree() -> None:
    rows, pool = make_pools(64)
    cache = RadixCache(rows, pool)
    a, b = pool.alloc(3), pool.alloc(3)
    cache.insert([1, 2, 3], a, "a")
    cache.insert([1, 2, 3], b, "b")
    locked = cache.match_prefix([1, 2, 3], "a").last_node
    cache.inc_lock_ref(locked)
    assert cache.protected_size() == 3 and cache.evictable_size() == 3
    assert cache.evict(10) == 3  # only b's tree is unlocked
    assert cache.match_prefix([1, 2, 3], "b").indices.numel() == 0
    assert cache.match_prefix([1, 2, 3], "a").indices.numel() == 3
    cache.dec_lock_ref(locked)
    assert cache.evict(10) == 3
    assert cache.evictable_size() == 0 and cache.protected_size() == 0
    cache.check_invariants()


def test_finished_requests_cache_under_their_adapter() -> None:
    """cache_finished_req inserts under the request's adapter: a base request with the same
    prompt matches nothing, one of the same adapter matches all of it."""
    rows, pool = make_pools(64)
    cache = RadixCache(rows, pool)
    ids = [9, 8, 7, 6, 5]
    for req in (lora_req("x", ids, "a"), make_req("y", ids)):
        row = rows.alloc()
        assert row is not None
        req.req_pool_idx, req.last_node = row, cache.match_prefix([], req.cache_namespace).last_node
        slots = pool.alloc(len(ids))
        assert slots is not None
        rows.write_row(row, 0, slots)
        req.kv_len = len(ids)
        cache.inc_lock_ref(req.last_node)
        cache.cache_finished_req(req)
    got_a = cache.match_prefix(ids, "a").indices
    got_base = cache.match_prefix(ids).indices
    assert got_a.numel() == 5 and got_base.numel() == 5
    assert not set(got_a.tolist()) & set(got_base.tolist())
    assert cache.match_prefix(ids, "other").indices.numel() == 0
    assert sorted(torch.cat(cache.cached_slots()).tolist()) == sorted(
        got_a.tolist() + got_base.tolist()
    )
    cache.check_invariants()
