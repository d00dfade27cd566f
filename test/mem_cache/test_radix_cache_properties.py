"""Property-based tests of RadixCache: random insert / match / lock / evict sequences, interleaved
with requests that are admitted, prefilled in chunks, decoded, retracted and finished the way the
scheduler drives them (`Req`, `ReqToTokenPool`, `cache_unfinished_req`, `cache_finished_req`).

Only the cache's public contract is used (match_prefix, insert, inc/dec_lock_ref, evict,
evictable_size, protected_size, cached_slots, cache_*_req), so the test holds for any tree layout
or eviction bookkeeping. Invariants checked after every step:
- every (page-aligned) token prefix maps to one KV slot: a match returns the slots first inserted;
- whatever was inserted and not evicted is matched in full (without eviction nothing is lost);
- locked prefixes survive any eviction, and a running request's cached prefix stays in the tree
  at the slots listed in its row;
- protected == the tokens of the locked prefixes (each prefix counted once);
- evictable + protected == slots held by the tree, and free + held + request-owned == the pool
  (nothing leaks, no slot is owned twice: `check_kv_accounting`, the scheduler's debug check).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from req_helpers import make_req

from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.mem_cache.radix_cache import RadixCache, common_prefix_len
from radixgen.runtime.scheduler.accounting import check_kv_accounting
from radixgen.runtime.scheduler.req import Req

POOL_TOKENS = 256
VOCAB = 4  # a tiny alphabet makes shared prefixes and node splits frequent
REQ_SLOTS = 4
MAX_PROMPT_LEN = 24
MAX_SEQ_LEN = 40  # prompt + outputs; well inside a request row
ROW_LEN = 64

keys = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT_LEN)


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.page = page_size
        self.pool = TokenToKVPool(POOL_TOKENS, page_size, 1, 1, 2, torch.float32)
        self.req_to_token_pool = ReqToTokenPool(REQ_SLOTS, ROW_LEN)
        self.cache = RadixCache(self.req_to_token_pool, self.pool, page_size)
        self.slot_of: dict[
            tuple[int, ...], int
        ] = {}  # token prefix -> the slot holding its last token
        self.inserted: list[tuple[int, ...]] = []
        self.locks: list[tuple[object, tuple[int, ...]]] = []
        self.running: list[Req] = []
        self.waiting: list[Req] = []  # retracted, to be admitted again
        self.prompts: list[list[int]] = []
        self.n_reqs = 0
        self.evicted_any = False

    def _aligned(self, n: int) -> int:
        return n - n % self.page

    def _page_key(self, key: list[int], i: int) -> tuple[tuple[int, ...], int]:
        end = (i // self.page + 1) * self.page
        return tuple(key[:end]), i

    def _evict(self, n: int) -> int:
        freed = self.cache.evict(n)
        self.evicted_any = self.evicted_any or freed > 0
        return freed

    def _row(self, req: Req) -> torch.Tensor:
        assert req.req_pool_idx is not None
        return self.req_to_token_pool.req_to_token[req.req_pool_idx]

    def _record_insert(self, key: list[int], slots: torch.Tensor, already: int) -> None:
        """The tree now holds key -> slots, of which the first `already` it held before."""
        for i in range(already, len(key)):
            self.slot_of[self._page_key(key, i)] = int(slots[i])
        self.inserted.append(tuple(key))

    # --- the tree on its own ------------------------------------------------------------------

    @rule(key=keys)
    def insert(self, key: list[int]) -> None:
        n = self._aligned(len(key))
        if n == 0:
            return
        slots = self.pool.alloc(n)
        if slots is None:
            self._evict(n)
            slots = self.pool.alloc(n)
            if slots is None:
                return
        already = self.cache.insert(key, slots)
        assert already % self.page == 0 and already <= n
        self.pool.free(slots[:already])  # duplicates of what the tree holds
        self._record_insert(key[:n], slots, already)

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
        freed = self._evict(n)
        assert freed >= min(n, before) or self.cache.evictable_size() == 0
        assert self.cache.evictable_size() == before - freed

    # --- requests, as the scheduler drives them -------------------------------------------------

    @precondition(lambda self: self.req_to_token_pool.available_size() > 0)
    @rule(data=st.data())
    def admit(self, data) -> None:
        """A few requests (new or retracted ones) each match a prefix, lock it, take a row."""
        count = data.draw(st.integers(1, self.req_to_token_pool.available_size()), label="count")
        for _ in range(count):
            self._admit_one(data)

    def _admit_one(self, data) -> None:
        if self.waiting and data.draw(st.booleans(), label="readmit a retracted request"):
            req = self.waiting.pop(data.draw(st.integers(0, len(self.waiting) - 1)))
        else:
            prompt = data.draw(keys, label="prompt")
            if self.prompts and data.draw(st.booleans(), label="share an earlier prompt"):
                # requests that share a prompt prefix while both run hand over duplicate slots
                shared = data.draw(st.sampled_from(self.prompts))
                extra = data.draw(st.integers(0, 4))
                prompt = [*shared, *prompt][: min(len(shared) + extra, MAX_PROMPT_LEN)]
            self.prompts.append(prompt)
            self.n_reqs += 1
            req = make_req(f"r{self.n_reqs}", prompt, arrival_time=float(self.n_reqs))
        match = self.cache.match_prefix(req.all_ids[: req.seq_len - 1])  # >= 1 token to compute
        prefix_len = match.indices.numel()
        assert prefix_len % self.page == 0
        self.cache.inc_lock_ref(match.last_node)
        row = self.req_to_token_pool.alloc()
        assert row is not None
        req.req_pool_idx, req.last_node = row, match.last_node
        self.req_to_token_pool.req_to_token[row, :prefix_len] = match.indices
        req.kv_len = req.cache_protected_len = prefix_len
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step(self, data) -> None:
        """One scheduler step: each running request runs a prefill chunk or decodes one token."""
        for req in list(self.running):
            chunk = data.draw(st.integers(1, 24), label="chunk")
            token = data.draw(st.integers(0, VOCAB - 1), label="sampled token")
            self._step_one(req, chunk, token)

    def _step_one(self, req: Req, chunk: int, token: int) -> None:
        pending = req.seq_len - req.kv_len
        if pending == 0:
            return  # at its length limit: it can only finish
        n = 1 if pending == 1 else min(pending, chunk)
        page = self.page
        need = (-(-(req.kv_len + n) // page) - -(-req.kv_len // page)) * page  # fresh pages
        if self.pool.available_size() < need:
            self._evict(need - self.pool.available_size())
            if self.pool.available_size() < need:
                return  # pool short: the scheduler would retract someone
        row = self._row(req)
        last_loc = int(row[req.kv_len - 1]) if req.kv_len else -1
        slots = self.pool.alloc_extend([req.kv_len], [n], [last_loc])
        assert slots is not None and slots.numel() == n
        row[req.kv_len : req.kv_len + n] = slots
        req.kv_len += n
        if req.kv_len == req.seq_len and req.seq_len < MAX_SEQ_LEN:
            req.output_ids.append(token)  # sampled
        if n > 1 and req.kv_len - n < len(req.origin_input_ids):
            self._cache_unfinished(req)

    def _handed_over(self, key: list[int], own: torch.Tensor, protected: int) -> int:
        """After cache_*_req: the tree holds `key`, at the slots it already held (first) and then
        at the request's own slots. Record it; return how many tokens the tree already held."""
        tree = self.cache.match_prefix(key).indices.tolist()
        assert len(tree) == len(key), "a request's tokens were not cached"
        assert tree[:protected] == own[:protected].tolist(), "a request's prefix moved"
        already = next(
            (i for i in range(protected, len(key)) if tree[i] == own[i]), len(key)
        )  # an own slot is never in the tree before the hand-over, so this is where they start
        assert already % self.page == 0
        assert tree[already:] == own[already : len(key)].tolist()
        for i in range(already):
            assert tree[i] == self.slot_of[self._page_key(key, i)], "prefix mapped elsewhere"
        self._record_insert(key, own, already)
        return already

    def _cache_unfinished(self, req: Req) -> None:
        """After a prefill chunk: the computed prefix is shared, the request keeps using it."""
        aligned = self._aligned(req.kv_len)
        protected = req.cache_protected_len
        own = self._row(req)[:aligned].clone()
        self.cache.cache_unfinished_req(req)
        if aligned <= protected:
            assert req.cache_protected_len == protected
            return
        key = req.all_ids[:aligned]
        already = self._handed_over(key, own, protected)
        tree = self.cache.match_prefix(key).indices.tolist()
        assert self._row(req)[:aligned].tolist() == tree, "row not switched to the tree's slots"
        assert req.cache_protected_len == aligned
        duplicates = set(own[protected:already].tolist())
        assert duplicates <= self.pool.free_slot_set(), "duplicate slots not freed"

    def _release(self, req: Req) -> None:
        """Finish (or retract): the request's KV goes to the tree, its row is freed."""
        aligned = self._aligned(req.kv_len)
        key = req.all_ids[:aligned]
        protected = req.cache_protected_len
        own = self._row(req)[: req.kv_len].clone()
        rows_free = self.req_to_token_pool.available_size()
        self.cache.cache_finished_req(req)
        self.running.remove(req)
        assert req.req_pool_idx is None and req.kv_len == 0 and req.cache_protected_len == 0
        assert self.req_to_token_pool.available_size() == rows_free + 1
        already = self._handed_over(key, own, protected)
        released = set(own[protected:already].tolist()) | set(own[aligned:].tolist())
        assert released <= self.pool.free_slot_set(), "duplicate or tail slots not freed"

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def release(self, data) -> None:
        """A request finishes (or is aborted), or is retracted to the waiting queue."""
        req = self.running[data.draw(st.integers(0, len(self.running) - 1), label="request")]
        self._release(req)
        if data.draw(st.booleans(), label="retract"):
            req.reset_for_retract()
            self.waiting.append(req)

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def locked_prefixes_survive(self) -> None:
        for _, key in self.locks:
            assert self.cache.match_prefix(list(key)).indices.numel() == len(key)
        for req in self.running:
            protected = req.cache_protected_len
            tree = self.cache.match_prefix(req.all_ids[:protected]).indices
            assert tree.tolist() == self._row(req)[:protected].tolist(), "a request's prefix moved"

    @invariant()
    def sizes_add_up(self) -> None:
        held = [s for t in self.cache.cached_slots() for s in t.tolist()]
        assert len(held) == len(set(held)), "a slot is held by two nodes"
        assert self.cache.evictable_size() + self.cache.protected_size() == len(held)
        free = self.pool.free_slot_set()
        assert not (free & set(held)), "a slot is both free and cached"
        check_kv_accounting(self.pool, self.cache, self.req_to_token_pool, self.running)
        if not self.running:
            assert len(free) + len(held) == self.pool.size, "KV slots leaked"
        # protected = the tokens of the union of locked prefixes (a lock covers its whole path;
        # pages are never shared, so a token is identified by its page-aligned prefix)
        locked = [list(key) for _, key in self.locks]
        locked += [r.all_ids[: r.cache_protected_len] for r in self.running]
        expected_protected = len({self._page_key(k, i) for k in locked for i in range(len(k))})
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
