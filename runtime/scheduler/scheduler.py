"""The scheduler: continuous batching over the paged KV pool with the prefix cache (scheduler process).

Every step: admit waiting requests (prefix match, lock, allocate, chunked-prefill budget), run one
forward over the mixed batch (decodes + prefill chunks), sample, then finish or stream each request.
When the pool is short it evicts unlocked cache first and then retracts the newest requests back to
the queue. `step()` is pure logic over injected collaborators (model runner, tokenizer, prefix cache,
grammar manager; `scheduler_process.build_scheduler` makes the real ones), so planning is
unit-tested with a fake runner; `run_scheduler_process` wraps it with ZMQ I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from radixgen.errors import InvalidRequestError
from radixgen.finish_reason import FinishReason
from radixgen.internal_state import (
    KVPoolState,
    PrefixCacheState,
    QueueState,
    SchedulerCounters,
    SchedulerState,
    SpeculationState,
    StepState,
)
from radixgen.io_struct import (
    AbortReq,
    BatchTokenIDOut,
    ControlOut,
    DashboardSnapshotOut,
    DashboardSnapshotReq,
    FlushCacheOut,
    FlushCacheReq,
    GetInternalStateOut,
    GetInternalStateReq,
    LoadLoraAdapterReq,
    LoraAdapterOut,
    MessageDispatch,
    SchedulerInbound,
    TokenizedGenerateReq,
    UnloadLoraAdapterReq,
)
from radixgen.kernels.step_cancel import CancelFlag, StepCancelled
from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
from radixgen.runtime.sampling.sampler import Sampler
from radixgen.runtime.scheduler.accounting import check_kv_accounting
from radixgen.runtime.scheduler.background_budget import BackgroundBudget
from radixgen.runtime.scheduler.containment import (
    internal_error,
    log_internal_error,
    poll_one_by_one,
)
from radixgen.runtime.scheduler.dashboard_probe import DashboardProbe
from radixgen.runtime.scheduler.draft_planner import DraftModels, DraftPlanner
from radixgen.runtime.scheduler.draft_verifier import DraftVerifier
from radixgen.runtime.scheduler.interfaces import StepRunner, TextDecoder
from radixgen.runtime.scheduler.output_processor import collect_outputs, failure_output
from radixgen.runtime.scheduler.overlap import needs_sync, overlap_enabled
from radixgen.runtime.scheduler.planner import (
    PlannerConfig,
    PlanningFailed,
    RequestQueues,
    StepPlanner,
)
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.result_processor import ResultProcessor, TokenLimits
from radixgen.runtime.scheduler.schedule_policy import PreemptionPolicy, priority_rank
from radixgen.runtime.scheduler.step_executor import LaunchedStep, StepExecutor
from radixgen.runtime.scheduler.step_interrupt import StepInterrupt
from radixgen.runtime.scheduler.step_plan import EMPTY_PLAN, StepPlan
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.constrained.grammar_manager import GrammarManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelLimits:
    """What the scheduler must know of the model: where sequences end and how large logits are."""

    context_length: int
    vocab_size: int
    eos_token_ids: list[int]


class Scheduler:
    """Owns the request queues and runs the step pipeline: the `StepPlanner` returns a frozen
    `StepPlan`, the `StepExecutor` launches it, the `ResultProcessor` commits it; with overlap
    on, a step is committed after the next one is launched."""

    def __init__(
        self,
        args: ServerArgs,
        model_runner: StepRunner,
        tokenizer: TextDecoder,
        cache: BasePrefixCache,
        grammar_manager: GrammarManager | None,
        limits: ModelLimits,
    ) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.cache = cache
        self.context_length = limits.context_length
        self.vocab_size = limits.vocab_size
        self.eos_token_ids = list(limits.eos_token_ids)
        self.kv_pool = model_runner.kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.page_size = args.cache.page_size
        self.max_request_tokens = min(self.context_length, self.kv_pool.size)

        sched = args.scheduler
        self.queues = RequestQueues()
        self.lora_unloading: set[str] = set()  # adapters unloaded once their requests finish
        self.outbox: list[Req] = []  # requests with something to send this step
        self.forward_steps = 0
        self.stats = SchedulerCounters()  # counters since start
        self.probe = DashboardProbe()
        self.overlap = overlap_enabled(args, str(getattr(model_runner, "device", "cpu")))
        self.inflight: LaunchedStep | None = None  # launched, committed after the next launch
        # cuts all-background steps for interactive arrivals (set by the scheduler process on a
        # CPU with one tensor-parallel rank; see step_interrupt.py)
        self.interrupt: StepInterrupt | None = None
        self.last_step_cut = False  # the latest step stopped for an interactive arrival
        self.background_budget = BackgroundBudget(sched.background_step_ms)
        self.executor = StepExecutor(
            model_runner, Sampler(self.vocab_size, self.eos_token_ids), self.stats
        )
        self.draft_models: DraftModels | None = None
        self.drafts: DraftPlanner | None = None
        verifier: DraftVerifier | None = None
        if args.speculative.enabled:
            graphs = getattr(model_runner, "graph_runner", None) is not None
            self.draft_models = DraftModels.create(args.speculative, graphs)
            self.drafts = DraftPlanner(
                args.speculative,
                self.draft_models,
                self.kv_pool,
                self.req_to_token_pool,
                self.context_length,
            )
            verifier = DraftVerifier(self.draft_models, self.kv_pool, self.req_to_token_pool)
        self.planner = StepPlanner(
            PlannerConfig.from_args(args, self.context_length, self.req_to_token_pool.size),
            self.queues,
            cache,
            self.kv_pool,
            self.req_to_token_pool,
            PreemptionPolicy(
                enabled=not sched.disable_priority_preemption,
                by_priority=sched.enable_priority_scheduling,
                threshold=sched.priority_scheduling_preemption_threshold,
            ),
            self.background_budget,
            self.drafts,
            self.stats,
        )
        limits_ = TokenLimits(self.context_length, tuple(self.eos_token_ids))
        self.results = ResultProcessor(
            self.executor, cache, grammar_manager, verifier, tokenizer, limits_, self.stats, self
        )
        self._dispatch = self._message_dispatch()

    # --- the queues (shared with the planner) -------------------------------------------------

    @property
    def waiting(self) -> list[Req]:
        return self.queues.waiting

    @waiting.setter
    def waiting(self, reqs: list[Req]) -> None:
        self.queues.waiting = reqs

    @property
    def running(self) -> list[Req]:
        return self.queues.running

    @property
    def grammar_waiting(self) -> list[Req]:
        return self.queues.grammar_waiting

    @grammar_waiting.setter
    def grammar_waiting(self, reqs: list[Req]) -> None:
        self.queues.grammar_waiting = reqs

    @property
    def new_token_ratio(self) -> float:
        return self.planner.new_token_ratio

    # --- collaborators (tests swap them after construction) -----------------------------------

    @property
    def model_runner(self) -> StepRunner:
        return self.executor.model_runner

    @model_runner.setter
    def model_runner(self, runner: StepRunner) -> None:
        self.executor.model_runner = runner

    @property
    def grammar_manager(self) -> GrammarManager | None:
        return self.results.grammars

    @grammar_manager.setter
    def grammar_manager(self, grammars: GrammarManager | None) -> None:
        self.results.grammars = grammars

    # --- requests in --------------------------------------------------------------------------

    def handle(self, msg: SchedulerInbound) -> ControlOut | None:
        """Handle one message of the scheduler socket; returns the reply of a control request.

        Raises UnknownMessageError for a type this scheduler does not take (an embedding
        server's `TokenizedEmbeddingReq`)."""
        return self._dispatch(msg)

    def _message_dispatch(self) -> MessageDispatch[ControlOut | None]:
        return (
            MessageDispatch[ControlOut | None]("scheduler")
            .on(TokenizedGenerateReq, self.add_request)
            .on(AbortReq, self.abort)
            .on(FlushCacheReq, self._on_flush_cache)
            .on(LoadLoraAdapterReq, self._on_change_lora)
            .on(UnloadLoraAdapterReq, self._on_change_lora)
            .on(GetInternalStateReq, self._on_internal_state)
            .on(DashboardSnapshotReq, self._on_dashboard_snapshot)
        )

    def _on_flush_cache(self, msg: FlushCacheReq) -> FlushCacheOut:
        reply = self.flush_cache(msg.keep_lower_tiers)
        reply.request_id = msg.request_id
        return reply

    def _on_change_lora(self, msg: LoadLoraAdapterReq | UnloadLoraAdapterReq) -> LoraAdapterOut:
        reply = self.change_lora(msg)
        reply.request_id = msg.request_id
        return reply

    def _on_internal_state(self, msg: GetInternalStateReq) -> GetInternalStateOut:
        return GetInternalStateOut(self.internal_state(), request_id=msg.request_id)

    def _on_dashboard_snapshot(self, msg: DashboardSnapshotReq) -> DashboardSnapshotOut:
        snap = self.probe.snapshot(self, msg.max_nodes)
        return DashboardSnapshotOut(snap, request_id=msg.request_id)

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        req = Req(msg, self.args.model.random_seed)
        low_first = self.args.scheduler.schedule_low_priority_values_first
        req.rank = priority_rank(req.priority, req.background, low_first)
        if not req.background:
            self.background_budget.interactive_arrived(time.monotonic())
            if self.interrupt is not None:
                self.interrupt.on_request(req.rid)
        # NOTE: the TokenizerManager refuses these with precise 4xx errors first (its limit is
        # `max_request_tokens`, sent in SchedulerReadyOut); this guard keeps a request that could
        # never fit out of the queue whatever the caller.
        limit = self.max_request_tokens
        total = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
        if not req.origin_input_ids:
            req.finish(FinishReason.abort("the prompt is empty", 400))
        elif req.lora_id is not None and (
            not self._lora_loaded(req.lora_id) or req.lora_id in self.lora_unloading
        ):
            req.finish(FinishReason.abort(f"LoRA adapter {req.lora_id!r} is not loaded", 400))
        elif total > limit:
            req.finish(
                FinishReason.abort(
                    f"prompt ({len(req.origin_input_ids)} tokens) + max_new_tokens "
                    f"({req.sampling_params.max_new_tokens}) exceeds the limit of {limit} tokens",
                    400,
                )
            )
        if req.lora_id is not None and not req.finished:
            lora = getattr(self.model_runner, "lora", None)
            assert lora is not None, "a loaded adapter has a LoRA manager"
            req.cache_namespace = lora.cache_namespace(req.lora_id)
        if req.finished:
            self.outbox.append(req)
            return
        if req.constrained:
            if self.grammar_manager is None:
                req.finish(
                    FinishReason.abort("constrained decoding is off (grammar_backend=none)", 400)
                )
                self.outbox.append(req)
                return
            self.grammar_manager.submit(req)
            self.grammar_waiting.append(req)
            return
        self.waiting.append(req)

    def _lora_loaded(self, name: str) -> bool:
        lora = getattr(self.model_runner, "lora", None)  # a ModelRunner's LoraManager, or None
        return lora is not None and name in lora

    def change_lora(self, msg: LoadLoraAdapterReq | UnloadLoraAdapterReq) -> LoraAdapterOut:
        """Load an adapter, or unload one: at once when no request of it is held, else once the
        last of them finishes (`_finish_lora_unloads`); new requests of it are refused now."""
        lora = getattr(self.model_runner, "lora", None)
        if lora is None:
            return LoraAdapterOut(False, "LoRA adapters are not enabled (--enable-lora)")
        name = msg.lora_name
        if name in self.lora_unloading:
            return LoraAdapterOut(False, f"LoRA adapter {name!r} is being unloaded")
        try:
            if isinstance(msg, LoadLoraAdapterReq):
                lora.load(name, msg.lora_path)
                return LoraAdapterOut(True, f"LoRA adapter {name!r} loaded")
            if name not in lora:
                return LoraAdapterOut(False, f"LoRA adapter {name!r} is not loaded")
        except InvalidRequestError as e:
            return LoraAdapterOut(False, str(e))
        self.lora_unloading.add(name)
        held = self._finish_lora_unloads()
        if name in held:
            return LoraAdapterOut(True, f"LoRA adapter {name!r} unloads once its requests finish")
        return LoraAdapterOut(True, f"LoRA adapter {name!r} unloaded")

    def _finish_lora_unloads(self) -> set[str]:
        """Unload the adapters waiting for their requests to finish; returns those still held."""
        held = {
            r.lora_id for r in (*self.running, *self.waiting, *self.grammar_waiting)
        } & self.lora_unloading
        lora = getattr(self.model_runner, "lora", None)
        for name in self.lora_unloading - held:
            if lora is not None and name in lora:
                lora.unload(name)
        self.lora_unloading = {n for n in self.lora_unloading if n in held}
        return {n for n in held if n is not None}

    def _poll_grammars(self) -> None:
        if not self.grammar_waiting or self.grammar_manager is None:
            return
        try:
            ready, failed = self.grammar_manager.poll(self.grammar_waiting)
        except Exception as e:  # NOTE: find the request(s) it fails for; fail only those
            log_internal_error("grammar polling", e)
            ready, failed = poll_one_by_one(self.grammar_manager, self.grammar_waiting)
        for req in failed:
            self.outbox.append(req)
        for req in ready:
            self.waiting.append(req)
        done = {id(r) for r in ready} | {id(r) for r in failed}
        self.grammar_waiting = [r for r in self.grammar_waiting if id(r) not in done]

    def abort(self, msg: AbortReq) -> None:
        reason = FinishReason.abort(msg.message, 499)
        for queue in (self.waiting, self.grammar_waiting):
            keep = []
            for r in queue:
                if msg.abort_all or r.rid == msg.rid:
                    r.finish(reason)
                    self.outbox.append(r)
                else:
                    keep.append(r)
            queue[:] = keep
        for r in list(self.running):
            if msg.abort_all or r.rid == msg.rid:
                r.finish(reason)
                self.release(r)
                self.outbox.append(r)

    def flush_cache(self, keep_lower_tiers: bool = False) -> FlushCacheOut:
        """Empty the prefix cache and the pools (every HiCache tier unless `keep_lower_tiers`);
        refused while requests are in flight."""
        if self.running or self.waiting or self.grammar_waiting:
            return FlushCacheOut(
                False,
                f"cannot flush the cache while requests are in flight "
                f"({len(self.running)} running, {len(self.waiting) + len(self.grammar_waiting)} waiting)",
            )
        self.cache.flush(keep_lower_tiers)
        if self.draft_models is not None:
            self.draft_models.corpus.clear()
        self.kv_pool.clear()
        self.req_to_token_pool.clear()
        return FlushCacheOut(True, "cache flushed")

    # --- one step -----------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Requests to step. Grammar compiles in flight are not work: offline loops use
        `has_work or grammar_waiting`, the process loop polls ZMQ briefly while they finish."""
        return bool(self.running or self.waiting or self.outbox or self.inflight)

    def step(self) -> list[BatchTokenIDOut]:
        """Plan, launch and commit one forward step; return the outputs to send.

        One pipeline for both modes: plan, launch, commit the step in flight (overlap), sample
        the launched step, then commit it at once (synchronous) or leave it in flight until the
        next step is launched (overlap). A step that must see every token on the host before it
        is planned (`needs_sync`) first commits the step in flight.

        A step whose rows are all batch lines may be cut between layers for an interactive
        arrival (`step_interrupt.py`): nothing of it is committed, and its rows run again.

        NOTE: containment. An exception in any stage fails the request it happened for (or, when
        the stage is batch-wide, that batch's requests) with a 500 abort, frees their KV and logs
        the traceback once; the loop and every other request carry on.
        """
        t0 = time.perf_counter()
        self.last_step_cut = False
        self._poll_grammars()
        overlapped = self.overlap and not needs_sync(self)
        if not overlapped:
            self._commit_inflight()
        plan = self._plan_step_contained()
        launched = self._launch_contained(plan, overlapped) if plan else None
        cut = self.last_step_cut
        edited = self._commit_inflight()  # the previous step's tokens, after this step's launch
        if launched is not None:
            # NOTE: a step carrying drafts is committed at once even when overlapped (a request
            # re-admitted with output may draft in an overlapped step): its verification must not
            # meet a request released since its launch
            self._sample_and_commit(launched, overlapped and not launched.plan.drafted, edited)
        if plan and not cut:
            self._after_step(plan)
        out = self._collect_outputs()
        if self.lora_unloading:
            self._finish_lora_unloads()
        seconds = time.perf_counter() - t0
        self.stats.step_seconds += seconds
        if not cut:
            self.background_budget.observe_step(plan.scheduled_tokens, seconds)
        if self.args.scheduler.debug_invariants:
            self.check_invariants()
        return out

    def _launch_contained(self, plan: StepPlan, overlapped: bool) -> LaunchedStep | None:
        cancel = self._cancel_flag(plan, overlapped)
        try:
            return self.executor.launch(plan, cancel)
        except StepCancelled:  # an interactive request came: its rows run again, unchanged
            self.last_step_cut = True
            self.stats.cut_steps += 1
            return None
        except Exception as e:  # NOTE: the loop must survive; fail this batch's requests only
            log_internal_error("the forward step", e)
            self.fail(plan.reqs, e)
            return None
        finally:
            if cancel is not None and self.interrupt is not None:
                self.interrupt.disarm(self.last_step_cut)

    def _cancel_flag(self, plan: StepPlan, overlapped: bool) -> CancelFlag | None:
        """The armed flag when this step may be cut: every row a batch line, no draft, not
        overlapped (an overlapped step's successor is planned on its tokens)."""
        if self.interrupt is None or overlapped or plan.drafted:
            return None
        if not all(r.background for r in plan.reqs):
            return None
        return self.interrupt.arm()

    def _sample_and_commit(self, step: LaunchedStep, overlapped: bool, stale: set[int]) -> None:
        """Launch the step's sampling; commit it now, or leave it in flight (overlap). `stale`:
        requests whose sequence the commit since its launch changed (their token is dropped)."""
        try:
            self.executor.sample(step, self.grammar_manager, overlapped, stale)
        except Exception as e:
            log_internal_error("sampling", e)
            self.results.drop_drafts(step)
            self.results.free_branch_rows(step)
            self.fail(step.batch.reqs, e)
            return
        if overlapped:
            self.inflight = step
            return
        self.results.commit(step)
        if self.draft_models is not None:
            self.draft_models.observe_step(step.batch.forward, time.perf_counter() - step.started)

    def _commit_inflight(self) -> set[int]:
        step, self.inflight = self.inflight, None
        return self.results.commit(step) if step is not None else set()

    def _after_step(self, plan: StepPlan) -> None:
        self.probe.on_step(plan, self)
        self.forward_steps += 1
        self.planner.after_step()

    # --- a request's lifecycle (the result processor's `RequestLifecycle`) --------------------

    def release(self, req: Req) -> None:
        """Give a finished or aborted request's KV to the cache and drop it from the running set
        (and its output to the shared draft corpus)."""
        if self.drafts is not None:
            self.drafts.remember_output(req)
        if req.req_pool_idx is not None:
            self.cache.cache_finished_req(req)
        if req in self.running:
            self.running.remove(req)

    def fail(self, reqs: Sequence[Req], e: Exception) -> None:
        """Finish `reqs` with a 500 abort wherever they are; free their KV and cache locks."""
        ids = {id(r) for r in reqs}
        self.waiting = [r for r in self.waiting if id(r) not in ids]
        self.grammar_waiting = [r for r in self.grammar_waiting if id(r) not in ids]
        for r in reqs:
            r.pending_sample = False  # a token in flight for it is dropped
            if r.finished and r not in self.running:
                continue
            if not r.finished:
                r.finish(internal_error(e))
            self.release(r)
            self.outbox.append(r)

    def emit(self, reqs: list[Req]) -> None:
        self.outbox.extend(reqs)

    # --- containment --------------------------------------------------------------------------

    def fail_all(self, e: Exception) -> list[BatchTokenIDOut]:
        """Last resort after a failure nobody could be blamed for: fail every request held,
        free everything, and return their final outputs (the scheduler then serves on)."""
        held = [*self.running, *self.waiting, *self.grammar_waiting, *self.outbox]
        self.inflight = None  # its requests are among those held
        self.fail(list(dict.fromkeys(held)), e)
        self.outbox = []
        return [failure_output(r) for r in dict.fromkeys(held)]

    def _plan_step_contained(self) -> StepPlan:
        """The planner's plan, failing the request(s) it was planning when it raised (no forward
        runs this step; the others are planned again next step, their KV untouched)."""
        try:
            return self.planner.plan(self.grammar_manager)
        except PlanningFailed as e:
            cause = e.__cause__ if isinstance(e.__cause__, Exception) else e
            log_internal_error("planning", cause)
            self.fail(e.reqs, cause)
            return EMPTY_PLAN

    def _collect_outputs(self) -> list[BatchTokenIDOut]:
        outbox, self.outbox = self.outbox, []
        self.probe.on_outbox(outbox)
        collected = collect_outputs(outbox, self.args.scheduler.stream_interval)
        messages = collected.messages
        for r, e in collected.failed:  # NOTE: fail these only; the others' outputs are sent
            log_internal_error(f"collecting the output of request {r.rid}", e)
            self.fail([r], e)
            messages.append(failure_output(r))
        self.outbox = []  # fail() queued them; their final message is the one above
        return messages

    # --- introspection ------------------------------------------------------------------------

    def internal_state(self) -> SchedulerState:
        spec = self.draft_models.stats if self.draft_models is not None else SpeculationState()
        return SchedulerState(
            queues=QueueState(
                running_requests=len(self.running),
                waiting_requests=len(self.waiting) + len(self.grammar_waiting),
                grammar_waiting_requests=len(self.grammar_waiting),
            ),
            kv_pool=KVPoolState(
                max_total_num_tokens=self.kv_pool.size,
                kv_cache_dtype=self.kv_pool.kv_format.name,
                kv_bytes_per_token=self.kv_pool.bytes_per_token(),
                kv_used_tokens=self.kv_pool.size - self.kv_pool.available_size(),
            ),
            prefix_cache=PrefixCacheState(
                cache_evictable_tokens=self.cache.evictable_size(),
                cache_protected_tokens=self.cache.protected_size(),
            ),
            steps=StepState(
                forward_steps=self.forward_steps,
                new_token_ratio=self.new_token_ratio,
                # time inside tensor-parallel collectives (rank 0's, waits for slower ranks)
                tp_comm_seconds=float(getattr(self.model_runner, "comm_seconds", 0.0)),
                dp_attention_idle_forwards=int(getattr(self.model_runner, "idle_forwards", 0)),
            ),
            counters=replace(self.stats),
            tiers=self.cache.tier_state(),
            speculation=replace(spec),
            grammar=self.grammar_manager.stats() if self.grammar_manager is not None else None,
        )

    def check_invariants(self) -> None:
        check_kv_accounting(self.kv_pool, self.cache, self.req_to_token_pool, self.running)
