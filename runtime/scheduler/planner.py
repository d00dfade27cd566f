"""Step planning: which running requests step, which waiting ones are admitted, and retraction
when the KV pool is short (scheduler process). The planner returns a frozen `StepPlan`.

Decodes come first (each gets its token; the newest are retracted while the pool cannot hold
them), then requests part-way through their prefill, then admissions by the schedule policy's
order within the chunked-prefill budget, keeping slots free for running requests' future tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixgen.runtime.mem_cache.radix_cache import RadixCache
from radixgen.runtime.scheduler.background_budget import BackgroundBudget
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.schedule_batch import pages_needed
from radixgen.runtime.scheduler.schedule_policy import PreemptionPolicy, order_waiting_queue
from radixgen.runtime.scheduler.step_plan import StepPlan

if TYPE_CHECKING:
    from radixgen.internal_state import SchedulerCounters
    from radixgen.runtime.constrained.grammar_manager import GrammarManager
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.scheduler.draft_planner import DraftPlanner
    from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)

RESERVE_CLIP = 1024  # future tokens reserved per running request are capped at this
IN_BATCH_SHARE_MIN = 32  # defer a request sharing this many tokens with one being prefilled


NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY = 0.002


@dataclass(frozen=True)
class PlannerConfig:
    """What planning needs of the server's settings."""

    page_size: int
    chunk_size: int | None  # chunked prefill (None: off)
    max_prefill_tokens: int
    max_running: int
    context_length: int
    schedule_policy: str
    max_loras_per_batch: int
    new_token_ratio: float  # the starting reservation for running requests' future tokens

    @classmethod
    def from_args(cls, args: ServerArgs, context_length: int, request_rows: int) -> PlannerConfig:
        sched = args.scheduler
        return cls(
            page_size=args.cache.page_size,
            chunk_size=sched.chunked_prefill_size if sched.chunked_prefill_size > 0 else None,
            max_prefill_tokens=sched.max_prefill_tokens,
            max_running=min(sched.max_running_requests, request_rows),
            context_length=context_length,
            schedule_policy=sched.schedule_policy,
            max_loras_per_batch=args.lora.max_loras_per_batch,
            new_token_ratio=NEW_TOKEN_RATIO_INIT * sched.schedule_conservativeness,
        )


@dataclass
class RequestQueues:
    """The scheduler's request sets, shared by the planner (admission, retraction) and the
    scheduler (arrivals, aborts, failures)."""

    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)
    grammar_waiting: list[Req] = field(default_factory=list)  # compiling their grammar


class PlanningFailed(Exception):
    """Planning raised `__cause__` while planning `reqs` (whom the failure is for: no forward
    runs this step; the other requests are planned again next step, their KV untouched)."""

    def __init__(self, reqs: list[Req]) -> None:
        super().__init__(f"planning failed for {len(reqs)} request(s)")
        self.reqs = reqs


class StepPlanner:
    """Plans each step over the shared queues, the prefix cache and the KV pools."""

    def __init__(
        self,
        config: PlannerConfig,
        queues: RequestQueues,
        cache: BasePrefixCache,
        kv_pool: TokenToKVPool,
        req_to_token_pool: ReqToTokenPool,
        preemption: PreemptionPolicy,
        background_budget: BackgroundBudget,
        drafts: DraftPlanner | None,
        stats: SchedulerCounters,
    ) -> None:
        self.config = config
        self.queues = queues
        self.cache = cache
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.preemption = preemption
        self.background_budget = background_budget
        self.drafts = drafts
        self.stats = stats
        self.page_size = config.page_size
        self.chunk_size = config.chunk_size
        self.max_prefill_tokens = config.max_prefill_tokens
        self.max_running = config.max_running
        self.context_length = config.context_length
        self.new_token_ratio = config.new_token_ratio
        self._planning: list[Req] = []  # the request(s) being planned (whom a failure is for)

    def plan(self, grammars: GrammarManager | None) -> StepPlan:
        """This step's plan. Raises `PlanningFailed` naming the request(s) it was planning."""
        self._planning = []
        try:
            return self._plan_step(grammars)
        except Exception as e:
            raise PlanningFailed(self._planning) from e
        finally:
            self._planning = []

    def after_step(self) -> None:
        """A step ran: the reservation for future tokens relaxes a little."""
        self.new_token_ratio = max(
            NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )

    def free_tokens(self, needed: int) -> bool:
        """Make `needed` slots free, evicting unlocked cache if necessary."""
        free = self.kv_pool.available_size()
        if free >= needed:
            return True
        self.stats.evicted_tokens += self.cache.evict(needed - free)
        return self.kv_pool.available_size() >= needed

    def _plan_step(self, grammars: GrammarManager | None) -> StepPlan:
        plan: list[tuple[Req, int]] = []  # (request, tokens it runs), in batch order
        self._preempt_for_waiting()
        decodes: list[Req] = []
        extends: list[Req] = []
        for (
            r
        ) in self.queues.running:  # NOTE: one pass (a hot loop: every running request, every step)
            pending = r.pending_len
            if pending == 1:
                if not self._ends_with_pending_token(r):
                    decodes.append(r)
            elif pending > 1:
                extends.append(r)
        extends.sort(key=lambda r: r.arrival_time)
        # 1) every decoding request gets its token; retract the newest when the pool is short
        self._planning = list(decodes)
        while decodes and not self.free_tokens(self.pages(decodes, 1) * self.page_size):
            # the lowest-ranked (batch lines, low priorities) first, the newest among equals
            victim = max(decodes + extends, key=lambda r: (r.rank, r.arrival_time))
            self._retract(victim)
            if victim in decodes:
                decodes.remove(victim)
            else:
                extends.remove(victim)
        plan.extend((r, 1) for r in decodes)
        budget = self.chunk_size or self.max_prefill_tokens
        # batch lines' prompt tokens this step: with interactive traffic about, what
        # --background-step-ms holds at the measured rate
        background = self.background_budget.tokens(
            len(decodes), any(not r.background for r in self.queues.running), time.monotonic()
        )
        if background is None or not self.chunk_size:  # nothing measured yet, or no chunking
            background = budget
        reserved = self.pages(decodes, 1) * self.page_size
        # 2) requests part-way through their prefill (chunks, jump-forward text) continue; a
        # step that prefills an interactive request prefills no batch line (its TTFT is then its
        # own prefill, not the batch's), so a line's next chunk waits while one is waiting
        yield_to_interactive = any(r.background for r in extends) and any(
            not r.background for r in (*extends, *self.queues.waiting)
        )
        for r in extends:
            if r.background and (yield_to_interactive or background <= 0):
                continue
            self._planning = [r]
            n = min(r.pending_len, budget) if self.chunk_size else r.pending_len
            if r.background:
                n = min(n, background)
            if n <= 0:
                break
            need = pages_needed(r, n, self.page_size) * self.page_size
            if not self.free_tokens(reserved + need):
                if not plan and r is extends[-1]:
                    self._retract(r)  # nothing can run: free the newest to break the deadlock
                continue
            reserved += need
            budget -= n
            if r.background:
                background -= n
            plan.append((r, n))
        # 3) admit waiting requests
        self._planning = list(self.queues.waiting)  # until one is picked: the queue's order failed
        if budget > 0 and self.queues.waiting:
            plan.extend(self._admit(budget, reserved, plan, background))
        # 4) a step that prefills an interactive request decodes no batch line either: it is
        # that request's time to first token, and it stays as short as the request alone (also
        # when its whole prompt was cached and only its last token runs)
        # NOTE: a hot loop (every row, every step): a decode row with output stops at `r.output_ids`
        if any(
            (n > 1 or not r.output_ids) and not r.background and (n > 1 or not r.pending_sample)
            for r, n in plan
        ):
            plan = [(r, n) for r, n in plan if not (r.background and n == 1)]
        if self.drafts is None:
            return StepPlan.of(plan)
        self._planning = [r for r, _ in plan]
        # speculative drafts where the pool has room (no eviction)
        return StepPlan.of(plan, self.drafts.plan(plan, grammars))

    def preemption_candidate(self) -> Req | None:
        """The best waiting request when it outranks some running one, else None."""
        if not (self.preemption.enabled and self.queues.waiting and self.queues.running):
            return None
        ready = [r for r in self.queues.waiting if not r.pending_sample]
        if not ready:
            return None
        cand = min(ready, key=lambda r: (r.rank, 0 if r.retractions else 1, r.arrival_time))
        return cand if self.preemption.victim(cand, self.queues.running) is not None else None

    def _preempt_for_waiting(self) -> None:
        """Retract lower-ranked running requests while the best waiting request cannot be
        admitted (rows or pool full), and only where that admits it: a victim must be outranked
        (`PreemptionPolicy`), and the pool must hold the candidate once the victims' KV is
        freed. O(running + waiting) per step, and nothing more unless some victim qualifies."""
        cand = self.preemption_candidate()
        if cand is None:
            return
        self._planning = [cand]
        match = self.cache.match_prefix(cand.all_ids[: cand.seq_len - 1], cand.cache_namespace)
        need = -(-(cand.seq_len - match.indices.numel()) // self.page_size) * self.page_size
        if self.chunk_size:
            need = min(need, -(-self.chunk_size // self.page_size) * self.page_size)
        self.cache.inc_lock_ref(match.last_node)  # its prefix is what it gains: keep it
        try:
            while True:
                rows_full = (
                    len(self.queues.running) >= self.max_running
                    or self.req_to_token_pool.available_size() == 0
                )
                if not rows_full and self.free_tokens(self._admission_need(cand, need)):
                    return
                victim = self.preemption.victim(cand, self.queues.running)
                if victim is None:
                    return
                if not rows_full:
                    victims = [r for r in self.queues.running if self.preemption.victim(cand, [r])]
                    # their own KV and the cache nodes only they lock become free or evictable
                    # (an upper bound: a prefix another request locks stays)
                    held = sum(r.kv_len for r in victims)
                    free = self.kv_pool.available_size() + self.cache.evictable_size()
                    if free + held < self._admission_need(cand, need, without=victims):
                        return  # preempting every candidate victim would not admit it
                self._retract(victim, reason=f"preempted for {cand.rid}")
        finally:
            self.cache.dec_lock_ref(match.last_node)

    def _admission_need(self, cand: Req, need: int, without: list[Req] | None = None) -> int:
        """Slots admission asks for `cand` (as `_admit_into` counts them): its tokens, a decode
        token per running request, and the reservation for running requests' future tokens."""
        gone = {id(r) for r in without or ()}
        running = [r for r in self.queues.running if id(r) not in gone]
        if not running:
            return need  # alone, admission runs it without a reservation
        future = sum(self._future_tokens(r) for r in running) + self._future_tokens(cand)
        return need + self.pages(running, 1) * self.page_size + int(future * self.new_token_ratio)

    def _ends_with_pending_token(self, r: Req) -> bool:
        """A request whose token in flight (overlap scheduling) surely finishes it by length: it
        needs no further step."""
        if not r.pending_sample:
            return False
        return len(r.output_ids) + 1 >= r.sampling_params.max_new_tokens or (
            r.seq_len >= self.context_length
        )

    def pages(self, reqs: list[Req], n: int) -> int:
        if self.page_size == 1:
            return n * len(reqs)
        return sum(pages_needed(r, n, self.page_size) for r in reqs)

    @staticmethod
    def _future_tokens(r: Req) -> int:
        """Tokens a request may still generate (capped), for the admission reservation."""
        left = r.sampling_params.max_new_tokens - len(r.output_ids)
        return min(max(left, 0), RESERVE_CLIP)

    def _admit(
        self, budget: int, reserved: int, plan: list[tuple[Req, int]], background: int
    ) -> list[tuple[Req, int]]:
        admitted: list[tuple[Req, int]] = []
        try:
            self._admit_into(admitted, budget, reserved, plan, background)
        finally:  # NOTE: also when planning fails part-way: an admitted request never waits twice
            if admitted:
                ids = {id(r) for r, _ in admitted}
                self.queues.waiting = [r for r in self.queues.waiting if id(r) not in ids]
        return admitted

    def _admit_into(
        self,
        admitted: list[tuple[Req, int]],
        budget: int,
        reserved: int,
        plan: list[tuple[Req, int]],
        background: int,
    ) -> None:
        """Admit waiting requests by the policy's order into `admitted` (and the running set),
        each with the tokens it runs; batch lines (background) take at most `background` prompt
        tokens in all."""
        prefilling = [r for r, n in plan if n > 1]
        interactive = any(not r.background for r in prefilling)
        future_tokens = sum(self._future_tokens(r) for r in self.queues.running)
        loaded = False  # a match copied host-tier KV into the pool (HiCache)
        # NOTE: every running request steps together, so the running set holds at most
        # --max-loras-per-batch distinct adapters (the model runner's slots)
        adapters = {r.lora_id for r in self.queues.running if r.lora_id is not None}
        max_adapters = self.config.max_loras_per_batch
        for req in order_waiting_queue(
            self.queues.waiting, self.config.schedule_policy, self.cache
        ):
            if budget <= 0 or len(self.queues.running) >= self.max_running:
                break
            if self.req_to_token_pool.available_size() == 0:
                break
            if req.pending_sample:
                continue  # retracted while its token was in flight: admitted once it arrives
            if req.background and (interactive or background <= 0):
                break  # batch lines come last in the order; not in an interactive prefill step
            if req.lora_id is not None and req.lora_id not in adapters:
                if len(adapters) >= max_adapters:
                    continue  # its adapter waits for a slot; other requests may still fit
            self._planning = [req]
            key_len = req.seq_len - 1  # at least one token must run to produce logits
            if req.input_logprob_start >= 0:
                key_len = min(key_len, req.input_logprob_start)
            match = self.cache.match_and_load(req.all_ids[:key_len], req.cache_namespace)
            prefix_len = match.indices.numel()
            loaded = loaded or match.host_tokens + match.storage_tokens > 0
            if self._shares_with_prefilling(
                req, prefix_len, [*prefilling, *(a for a, _ in admitted)]
            ):
                continue  # its prefix will be in the cache after this step
            extend = req.seq_len - prefix_len
            if self.chunk_size:
                n = min(extend, budget, background) if req.background else min(extend, budget)
            else:
                if extend > budget and (admitted or prefilling):
                    break
                n = extend
            need = -(-n // self.page_size) * self.page_size
            self.cache.inc_lock_ref(match.last_node)  # protect the prefix from our own eviction
            future_tokens += self._future_tokens(req)
            # slots kept free for running requests' future tokens (fewer retractions)
            future = (
                int(future_tokens * self.new_token_ratio) if self.queues.running or admitted else 0
            )
            try:
                fits = self.free_tokens(reserved + need + future)
                if not fits and not (self.queues.running or admitted or plan):
                    fits = self.free_tokens(reserved + need)  # alone: run without the reservation
            except Exception:
                self.cache.dec_lock_ref(match.last_node)  # not admitted: it holds no lock
                raise
            if not fits:
                self.cache.dec_lock_ref(match.last_node)
                break
            row = self.req_to_token_pool.alloc()
            assert row is not None
            req.req_pool_idx = row
            req.last_node = match.last_node
            if prefix_len:
                self.req_to_token_pool.write_row(row, 0, match.indices)
            req.kv_len = prefix_len
            req.cache_protected_len = prefix_len
            if not req.admitted_once:
                req.admitted_once = True
                req.cached_tokens = prefix_len
                req.host_cached_tokens = match.host_tokens
                req.storage_cached_tokens = match.storage_tokens
                req.admit_time = time.time()
                self.cache.record_hit(match.last_node)
                self.stats.prompt_tokens += len(req.origin_input_ids)
                self.stats.cached_tokens += prefix_len
                self.stats.host_cached_tokens += match.host_tokens
                self.stats.storage_cached_tokens += match.storage_tokens
            budget -= n
            if req.background:
                background -= n
            reserved += need
            interactive = interactive or not req.background
            if req.lora_id is not None:
                adapters.add(req.lora_id)
            admitted.append((req, n))
            self._add_running(req, int(match.indices[0]) if prefix_len else -1)
        if loaded:
            # NOTE: the pages a load filled for a request that was not admitted after all are
            # evictable cache again, but they may have taken room this step's planned tokens
            # were counted on: make that room free again
            self.free_tokens(reserved)

    def _add_running(self, req: Req, first_slot: int) -> None:
        """Add an admitted request to the running set next to the last running request on the
        same cached prefix (the same pool slot for its first token): the native attention reads
        a key block that consecutive requests share once for all of them (cascade attention),
        and the batch follows the running set's order. A scan of the running set, only at
        admission; the order changes no request's result (batch invariance)."""
        req.prefix_first_slot = first_slot
        running = self.queues.running
        if first_slot >= 0:
            table = self.req_to_token_pool.req_to_token
            for i in range(len(running) - 1, -1, -1):
                r = running[i]
                if r.prefix_first_slot < 0 and r.kv_len > 0 and r.req_pool_idx is not None:
                    # admitted with nothing cached (it may have computed this very prefix):
                    # its first slot, read once
                    r.prefix_first_slot = int(table[r.req_pool_idx, 0])
                if r.prefix_first_slot == first_slot:
                    running.insert(i + 1, req)
                    return
        running.append(req)

    def _shares_with_prefilling(self, req: Req, prefix_len: int, others: list[Req]) -> bool:
        """Would `req` match IN_BATCH_SHARE_MIN more tokens once `others` are in the cache?

        Called for every admission candidate against every request prefilled this step, so the
        common case is O(1): a short uncached tail cannot gain enough, and two token probes
        reject most non-sharing pairs before a full prefix comparison.
        """
        if not isinstance(self.cache, RadixCache):
            return False
        end = prefix_len + IN_BATCH_SHARE_MIN  # tokens [0, end) must be shared
        if req.seq_len - 1 < end:
            return False
        ids = req.origin_input_ids
        if len(ids) < end:
            ids = req.all_ids
        first, last = ids[prefix_len], ids[end - 1]
        for o in others:
            if o.cache_namespace != req.cache_namespace:
                continue  # another adapter's KV is never shared
            theirs = o.origin_input_ids
            if len(theirs) < end or theirs[prefix_len] != first or theirs[end - 1] != last:
                continue
            if theirs[:end] == ids[:end]:
                return True
        return False

    def _retract(self, req: Req, reason: str = "") -> None:
        """Send a running request back to the queue; its KV goes to the cache (evictable).
        `reason` names a preemption; without one the pool was short, so admissions reserve more
        for future tokens from now on."""
        self.cache.cache_finished_req(req)
        self.queues.running.remove(req)
        req.reset_for_retract()  # NOTE: output_ids are kept, so a grammar's state stays valid
        self.queues.waiting.append(req)
        self.stats.retractions += 1
        if not reason:
            self.new_token_ratio = min(1.0, self.new_token_ratio + 0.3)
        why = reason or "pool short"
        logger.info("retracted %s (%s): %d running", req.rid, why, len(self.queues.running))
