"""Property-based tests of RadixCache: random insert / match / lock / evict sequences keep the invariants.

Invariants checked after every step:
- every (page-aligned) token prefix maps to one KV slot: a match returns the slots first inserted;
- whatever was inserted and not evicted is matched in full (without eviction nothing is lost);
- locked prefixes survive any eviction;
- evictable + protected == slots held by the tree, and free + held == the pool (nothing leaks,
  no slot is owned twice).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.radix_cache import RadixCache, common_prefix_len

POOL_TOKENS = 256
VOCAB = 4  # a tiny alphabet makes shared prefixes and node splits frequent

keys = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.page = page_size
        self.pool = TokenToKVPool(POOL_TOKENS, page_size, 1, 1, 2, torch.float32)
        self.cache = RadixCache(ReqToTokenPool(4, 64), self.pool, page_size)
        self.slot_of: dict[
            tuple[int, ...], int
        ] = {}  # token prefix -> the slot holding its last token
        self.inserted: list[tuple[int, ...]] = []
        self.locks: list[tuple[object, tuple[int, ...]]] = []
        self.evicted_any = False

    def _aligned(self, n: int) -> int:
        return n - n % self.page

    def _page_key(self, key: list[int], i: int) -> tuple[tuple[int, ...], int]:
        end = (i // self.page + 1) * self.page
        return tuple(key[:end]), i

    @rule(key=keys)
    def insert(self, key: list[int]) -> None:
        n = self._aligned(len(key))
        if n == 0:
            return
        slots = self.pool.alloc(n)
        if slots is None:
            self.cache.evict(n)
            self.evicted_any = True
            slots = self.pool.alloc(n)
            if slots is None:
                return
        already = self.cache.insert(key, slots)
        assert already % self.page == 0 and already <= n
        self.pool.free(slots[:already])  # duplicates of what the tree holds
        for i in range(already, n):
            self.slot_of[self._page_key(key, i)] = int(slots[i])
        self.inserted.append(tuple(key[:n]))

    @rule(key=keys)
    def match(self, key: list[int]) -> None:
        res = self.cache.match_prefix(key)
        got = res.indices.tolist()
        assert len(got) % self.page == 0 and len(got) <= len(key)
        for i, slot in enumerate(got):
            assert self.slot_of[self._page_key(key, i)] == slot, "prefix mapped to a different slot"
        if not self.evicted_any:
            best = max((common_prefix_len(list(k), key) for k in self.inserted), default=0)
            assert len(got) == self._aligned(best), "an inserted prefix was not matched"

    @rule(key=keys)
    def lock(self, key: list[int]) -> None:
        res = self.cache.match_prefix(key)
        if res.indices.numel():
            self.cache.inc_lock_ref(res.last_node)
            self.locks.append((res.last_node, tuple(key[: res.indices.numel()])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        i = data.draw(st.integers(0, len(self.locks) - 1))
        node, _ = self.locks.pop(i)
        self.cache.dec_lock_ref(node)

    @rule(n=st.integers(1, POOL_TOKENS))
    def evict(self, n: int) -> None:
        before = self.cache.evictable_size()
        freed = self.cache.evict(n)
        self.evicted_any = self.evicted_any or freed > 0
        assert freed >= min(n, before) or self.cache.evictable_size() == 0
        assert self.cache.evictable_size() == before - freed

    @invariant()
    def locked_prefixes_survive(self) -> None:
        for _, key in self.locks:
            assert self.cache.match_prefix(list(key)).indices.numel() == len(key)

    @invariant()
    def sizes_add_up(self) -> None:
        held = [s for t in self.cache.cached_slots() for s in t.tolist()]
        assert len(held) == len(set(held)), "a slot is held by two nodes"
        assert self.cache.evictable_size() + self.cache.protected_size() == len(held)
        free = self.pool.free_slot_set()
        assert not (free & set(held)), "a slot is both free and cached"
        assert len(free) + len(held) == self.pool.size, "KV slots leaked"
        expected_protected = 0
        seen: set[int] = set()
        for node, _ in self.locks:  # protected = tokens on the union of locked root paths
            while node is not self.cache.root:
                if id(node) not in seen:
                    seen.add(id(node))
                    expected_protected += len(node.key)
                node = node.parent
        assert self.cache.protected_size() == expected_protected


TestRadixCache = RadixMachine.TestCase
TestRadixCache.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_match_splits_and_reports_page_aligned_prefix() -> None:
    pool = TokenToKVPool(64, 2, 1, 1, 2, torch.float32)
    cache = RadixCache(ReqToTokenPool(2, 16), pool, page_size=2)
    slots = pool.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], slots) == 0
    res = cache.match_prefix([1, 2, 3, 9, 9])  # diverges inside the second page
    assert res.indices.tolist() == slots[:2].tolist()
    assert cache.match_prefix([1, 2, 3, 4, 7]).indices.tolist() == slots[:4].tolist()
    assert cache.evictable_size() == 6


def test_lru_eviction_order() -> None:
    pool = TokenToKVPool(64, 1, 1, 1, 2, torch.float32)
    cache = RadixCache(ReqToTokenPool(2, 16), pool)
    a, b = pool.alloc(3), pool.alloc(3)
    cache.insert([1, 1, 1], a)
    cache.insert([2, 2, 2], b)
    cache.match_prefix([1, 1, 1])  # touch a: b is now least recently used
    assert cache.evict(3) == 3
    assert cache.match_prefix([2, 2, 2]).indices.numel() == 0
    assert cache.match_prefix([1, 1, 1]).indices.numel() == 3
