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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

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
from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
from radixgen.runtime.sampling.sampler import PendingSample, SampleOutput, Sampler
from radixgen.runtime.scheduler.accounting import check_kv_accounting
from radixgen.runtime.scheduler.background_budget import BackgroundBudget
from radixgen.runtime.scheduler.containment import (
    internal_error,
    log_internal_error,
    poll_one_by_one,
)
from radixgen.runtime.scheduler.dashboard_probe import DashboardProbe
from radixgen.runtime.scheduler.finish import check_finish
from radixgen.runtime.scheduler.interfaces import StepRunner, TextDecoder
from radixgen.runtime.scheduler.output_processor import (
    collect_outputs,
    failure_output,
    record_input_logprobs,
)
from radixgen.runtime.scheduler.overlap import InflightStep, OverlapScheduling
from radixgen.runtime.scheduler.planner import SchedulerPlanner
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.schedule_batch import (
    StepBatch,
    allocate_step_slots,
    build_step_batch,
)
from radixgen.runtime.scheduler.schedule_policy import PreemptionPolicy, priority_rank
from radixgen.runtime.speculative.scheduling import SpeculativeScheduling
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.constrained.grammar_manager import GrammarManager, JumpForwardEdit
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.model_executor.logits_output import LogitsOutput

logger = logging.getLogger(__name__)


NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY = 0.002


@dataclass(frozen=True)
class ModelLimits:
    """What the scheduler must know of the model: where sequences end and how large logits are."""

    context_length: int
    vocab_size: int
    eos_token_ids: list[int]


@dataclass
class SchedulerStats:
    """Counters since start, reported by /server_info and the metrics."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0  # of cached_tokens, copied back from the host tier (HiCache)
    storage_cached_tokens: int = 0  # of cached_tokens, read back from the file tier (HiCache)
    generated_tokens: int = 0
    retractions: int = 0
    evicted_tokens: int = 0
    jump_forward_tokens: int = 0
    # where the scheduler's time goes (seconds): whole steps, launching forwards (on CPU: the
    # forward itself), and waiting for the device's sampled tokens. Host work per step is
    # step - wait (a GPU), or step - forward (the CPU, where the forward runs inline).
    step_seconds: float = 0.0
    forward_seconds: float = 0.0
    device_wait_seconds: float = 0.0


def overlap_enabled(args: ServerArgs, device: str) -> bool:
    """Overlap scheduling: on by default on CUDA, on CPU only when asked (it hides nothing there);
    off with speculative decoding (its drafts need the previous step's tokens on the host)."""
    sched = args.scheduler
    if sched.disable_overlap_schedule:
        return False
    if args.speculative.enabled:
        if device.startswith("cuda"):
            logger.info("overlap scheduling off: speculative decoding runs steps one by one")
        return False
    return device.startswith("cuda") or sched.enable_overlap_schedule


class Scheduler(SchedulerPlanner, OverlapScheduling, SpeculativeScheduling):
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
        self.model_runner = model_runner
        self.tokenizer = tokenizer
        self.cache = cache
        self.grammar_manager = grammar_manager
        self.context_length = limits.context_length
        self.vocab_size = limits.vocab_size
        self.eos_token_ids = list(limits.eos_token_ids)
        self.kv_pool = model_runner.kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.page_size = args.cache.page_size
        self.max_request_tokens = min(self.context_length, self.kv_pool.size)
        self.sampler = Sampler(self.vocab_size, self.eos_token_ids)

        sched = args.scheduler
        self.max_running = min(sched.max_running_requests, self.req_to_token_pool.size)
        self.chunk_size = sched.chunked_prefill_size if sched.chunked_prefill_size > 0 else None
        self.max_prefill_tokens = sched.max_prefill_tokens
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT * sched.schedule_conservativeness
        self.preemption = PreemptionPolicy(
            enabled=not sched.disable_priority_preemption,
            by_priority=sched.enable_priority_scheduling,
            threshold=sched.priority_scheduling_preemption_threshold,
        )
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.grammar_waiting: list[Req] = []
        self.lora_unloading: set[str] = set()  # adapters unloaded once their requests finish
        self.outbox: list[Req] = []  # requests with something to send this step
        self._planning: list[Req] = []  # the request(s) being planned (whom a failure is for)
        self.forward_steps = 0
        self.stats = SchedulerStats()
        self.probe = DashboardProbe()
        self.overlap = overlap_enabled(args, str(getattr(model_runner, "device", "cpu")))
        self.inflight: InflightStep | None = None
        self.background_budget = BackgroundBudget(sched.background_step_ms)
        self._plan_tokens = 0  # tokens of the step being run: the step rate's measure
        self._init_speculation()
        self._dispatch = self._message_dispatch()
        self.future_ids = torch.zeros(
            self.req_to_token_pool.size, dtype=torch.long, device=self.req_to_token_pool.device
        )

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
                self._release(r)
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
        self.spec_corpus.clear()
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
        """Plan, run and process one forward step; return the outputs to send.

        NOTE: containment. An exception in any stage fails the request it happened for (or, when
        the stage is batch-wide, that batch's requests) with a 500 abort, frees their KV and logs
        the traceback once; the loop and every other request carry on.
        """
        t0 = time.perf_counter()
        self._plan_tokens = 0
        out = self._step_overlapped() if self.overlap else self._step_sync()
        if self.lora_unloading:
            self._finish_lora_unloads()
        seconds = time.perf_counter() - t0
        self.stats.step_seconds += seconds
        self.background_budget.observe_step(self._plan_tokens, seconds)
        if self.args.scheduler.debug_invariants:
            self.check_invariants()
        return out

    def _step_sync(self) -> list[BatchTokenIDOut]:
        """One step whose tokens are handled before it returns."""
        self._poll_grammars()
        plan = self._plan_step_contained()
        if plan:
            try:
                self._run(plan)
            except Exception as e:  # NOTE: the loop must survive; fail this batch's requests only
                log_internal_error("the forward step", e)
                self._fail(plan, e)
            self._after_step(plan)
        return self._collect_outputs()

    def _after_step(self, plan: list[Req]) -> None:
        self.probe.on_step(plan, self)
        self.forward_steps += 1
        self.new_token_ratio = max(
            NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )

    # --- containment --------------------------------------------------------------------------

    def _fail(self, reqs: list[Req], e: Exception) -> None:
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
            self._release(r)
            self.outbox.append(r)

    def fail_all(self, e: Exception) -> list[BatchTokenIDOut]:
        """Last resort after a failure nobody could be blamed for: fail every request held,
        free everything, and return their final outputs (the scheduler then serves on)."""
        held = [*self.running, *self.waiting, *self.grammar_waiting, *self.outbox]
        self.inflight = None  # its requests are among those held
        self._fail(list(dict.fromkeys(held)), e)
        self.outbox = []
        return [failure_output(r) for r in dict.fromkeys(held)]

    def _plan_step_contained(self) -> list[Req]:
        """`_plan_step`, failing the request(s) it was planning when it raised (no forward runs
        this step; the others are planned again next step, their KV untouched)."""
        self._planning = []
        try:
            return self._plan_step()
        except Exception as e:
            log_internal_error("planning", e)
            self._fail(self._planning, e)
            return []
        finally:
            self._planning = []

    def _run(self, plan: list[Req]) -> None:
        t0 = time.perf_counter()
        slots = allocate_step_slots(plan, self.kv_pool, self.req_to_token_pool.req_to_token)
        assert slots is not None, "planner admitted more tokens than the pool holds"
        branches = self._allocate_branches(plan) if self.spec_enabled else None
        try:
            batch = build_step_batch(plan, slots, self.req_to_token_pool, branches)
            logits = self._forward(batch.forward)
        except Exception:
            self.kv_pool.free(slots)  # nobody owns this step's slots yet
            self._release_branches(branches)
            raise
        try:
            self._process(batch, logits)
        finally:
            self._release_branches(None)
        if self.spec_enabled:
            self._observe_step_cost(batch.forward, time.perf_counter() - t0)

    def _jump_forward(self, req: Req) -> None:
        """Let the grammar append the text it forces (no model step) and apply its edit."""
        edit = self._find_jump(req)
        if edit is not None:  # else nothing forced, or the request was finished (state lost)
            self._apply_jump(req, edit)

    def _find_jump(self, req: Req) -> JumpForwardEdit | None:
        """The grammar's forced-text edit (already accepted by the grammar: apply it)."""
        assert self.grammar_manager is not None
        sp = req.sampling_params
        max_len = min(sp.max_new_tokens, self.context_length - len(req.origin_input_ids)) - 1
        return self.grammar_manager.jump_forward(req, max_len)

    def _apply_jump(self, req: Req, edit: JumpForwardEdit) -> None:
        self._replace_output_tail(req, edit.keep, edit.tokens)
        req.jump_forward_tokens += edit.added
        self.stats.jump_forward_tokens += edit.added
        if req.value_checker is not None:
            self._check_values(req)

    def _check_values(self, r: Req) -> bool:
        """The checked layer (runtime/constrained/value_checker.py): validate the values the
        new tokens complete; on a failure roll the request back to where the value starts and
        ban that token there, or past the bound end it with an abort naming the keyword.
        True when the output was rolled back (its last token is gone: no finish check)."""
        checker, grammar = r.value_checker, r.grammar
        assert checker is not None and grammar is not None
        failure = checker.advance(r.output_ids, grammar.is_terminated())
        if failure is None:
            return False
        k = checker.retry_position(failure, len(r.output_ids))
        if k is not None and checker.note_rollback(k, r.output_ids[k]):
            self._roll_back_output(r, k)
            return True
        self._roll_back_output(r, failure.token_index)  # the failed value is never sent
        r.finish(
            FinishReason.abort(
                f"json_schema: the output kept breaking '{failure.keyword}' at "
                f"{failure.pointer or '/'}; no valid continuation found after "
                f"{checker.total_rollbacks} rollbacks",
                400,
            )
        )
        return True

    def _roll_back_output(self, r: Req, k: int) -> None:
        """Cut the output to its first k tokens: grammar, KV (token k-1 is recomputed, so the
        next step samples token k), logprobs and the checker's state."""
        assert r.grammar is not None and r.value_checker is not None
        r.grammar.rollback(len(r.output_ids) - k)
        del r.output_token_logprobs[k:]
        del r.output_top_logprobs[k:]
        if k > 0:
            self._replace_output_tail(r, k - 1, [r.output_ids[k - 1]])
        else:
            self._replace_output_tail(r, 0, [])

    def _replace_output_tail(self, req: Req, keep: int, new_tokens: list[int]) -> None:
        """Replace output_ids[keep:] by `new_tokens` (jump-forward after retokenization).

        KV of the replaced tokens is dropped so the next step recomputes them as one extend; tokens
        already streamed are reported as rolled back so the detokenizer re-derives their text.
        """
        keep_pos = len(req.origin_input_ids) + keep
        assert keep_pos >= req.cache_protected_len, "cannot roll back into shared cache"
        if req.kv_len > keep_pos and req.req_pool_idx is not None:
            first_free = -(-keep_pos // self.page_size) * self.page_size  # keep a shared tail page
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
            if req.kv_len > first_free:
                self.kv_pool.free(row[first_free : req.kv_len].clone())
            req.kv_len = keep_pos
        del req.output_ids[keep:]
        req.output_ids.extend(new_tokens)
        if req.value_checker is not None:
            req.value_checker.truncate(keep, req.output_ids)
        req.draft_state = None  # its n-gram index holds the replaced tokens
        if req.stop_regex is not None:
            req.stop_regex.reset()
        if keep < req.sent_output_len:
            req.rollback_pending += req.sent_output_len - keep
            req.sent_output_len = keep

    def _release(self, req: Req) -> None:
        """Give a finished or aborted request's KV to the cache and drop it from the running set
        (and its output to the shared draft corpus)."""
        self._remember_output(req)
        if req.req_pool_idx is not None:
            self.cache.cache_finished_req(req)
        if req in self.running:
            self.running.remove(req)

    # --- results ------------------------------------------------------------------------------

    def _process(self, batch: StepBatch, logits: LogitsOutput) -> None:
        for r in batch.reqs:
            r.kv_len += r.extend_len
        self._verify_drafts(batch, logits)
        record_input_logprobs(batch, logits)
        sample_reqs = batch.sampling_reqs
        if sample_reqs:
            rows = batch.sample_rows
            grammars = self.grammar_manager
            grammar_mask = grammar_rows = None
            if grammars is not None and any(r.grammar is not None for r in sample_reqs):
                grammar_mask, grammar_rows = grammars.fill_mask(sample_reqs)
            pending = self.sampler.launch(logits, rows, sample_reqs, grammar_mask, grammar_rows)
            out = self._resolve(pending)
            self._accept_all(sample_reqs, out)
        for r in batch.reqs:
            if r.finished:
                self._release(r)
            elif r.extend_len > 1 and r.kv_len - r.extend_len < len(r.origin_input_ids):
                self.cache.cache_unfinished_req(r)  # share the prompt (chunk) with later requests
            r.steps_since_stream += 1
            self.outbox.append(r)

    def _forward(self, batch: ForwardBatch) -> LogitsOutput:
        """The model runner's forward (on a GPU: its launch), timed."""
        t0 = time.perf_counter()
        logits = self.model_runner.forward(batch)
        self.stats.forward_seconds += time.perf_counter() - t0
        return logits

    def _resolve(self, pending: PendingSample) -> SampleOutput:
        """The sampled tokens on the host (the step's one wait for the device), timed."""
        t0 = time.perf_counter()
        out = pending.resolve()
        self.stats.device_wait_seconds += time.perf_counter() - t0
        return out

    def _accept_all(self, reqs: list[Req], out: SampleOutput, skip: set[int] | None = None) -> None:
        """Accept row i of `out` for reqs[i], except the requests whose id() is in `skip`."""
        for i, r in enumerate(reqs):
            if skip is not None and id(r) in skip:
                continue
            try:
                self._accept_sampled(r, out, i)
            except Exception as e:  # NOTE: fail this request only (released by the caller)
                log_internal_error(f"accepting the token of request {r.rid}", e)
                if not r.finished:
                    r.finish(internal_error(e))

    def _accept_sampled(self, r: Req, out: SampleOutput, i: int) -> None:
        """Append request r's sampled token (row i of `out`), advance its grammar, check finish."""
        if r.sampling_params.max_new_tokens == 0:
            r.finish(FinishReason.length(0))
            return
        self._append_token(r, out.next_ids[i], out.logprobs[i], out.top_logprobs[i])
        if not r.finished and r.grammar is not None:
            self._jump_forward(r)

    def _append_token(
        self, r: Req, tok: int, lp: float | None, top: list[tuple[float, int]] | None
    ) -> None:
        """Append one chosen token (sampled, or verified from a draft); advance the grammar and
        check finish."""
        if not r.output_ids and r.first_token_delay is None and r.arrival_time:
            r.first_token_delay = max(0.0, time.time() - r.arrival_time)
        r.output_ids.append(tok)
        self.stats.generated_tokens += 1
        if r.return_logprob:
            r.output_token_logprobs.append((lp, tok))
            if r.top_logprobs_num:
                r.output_top_logprobs.append(top)
        if self.grammar_manager is not None and r.grammar is not None:
            self.grammar_manager.accept(r, tok)
            if r.value_checker is not None and not r.finished and self._check_values(r):
                return
        check_finish(r, self.eos_token_ids, self.context_length, self.tokenizer)

    def _collect_outputs(self) -> list[BatchTokenIDOut]:
        outbox, self.outbox = self.outbox, []
        self.probe.on_outbox(outbox)
        collected = collect_outputs(outbox, self.args.scheduler.stream_interval)
        messages = collected.messages
        for r, e in collected.failed:  # NOTE: fail these only; the others' outputs are sent
            log_internal_error(f"collecting the output of request {r.rid}", e)
            self._fail([r], e)
            messages.append(failure_output(r))
        self.outbox = []  # _fail queued them; their final message is the one above
        return messages

    # --- introspection ------------------------------------------------------------------------

    def internal_state(self) -> SchedulerState:
        st, spec = self.stats, self.spec_stats
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
            counters=SchedulerCounters(
                prompt_tokens=st.prompt_tokens,
                cached_tokens=st.cached_tokens,
                host_cached_tokens=st.host_cached_tokens,
                storage_cached_tokens=st.storage_cached_tokens,
                generated_tokens=st.generated_tokens,
                retractions=st.retractions,
                evicted_tokens=st.evicted_tokens,
                jump_forward_tokens=st.jump_forward_tokens,
                step_seconds=st.step_seconds,
                forward_seconds=st.forward_seconds,
                device_wait_seconds=st.device_wait_seconds,
            ),
            tiers=self.cache.tier_state(),
            speculation=SpeculationState(
                spec_verify_steps=spec.spec_verify_steps,
                spec_verified_requests=spec.spec_verified_requests,
                spec_draft_tokens=spec.spec_draft_tokens,
                spec_accepted_tokens=spec.spec_accepted_tokens,
                spec_branch_tokens=spec.spec_branch_tokens,
                spec_branch_accepted_tokens=spec.spec_branch_accepted_tokens,
                spec_skipped_steps=spec.spec_skipped_steps,
            ),
            grammar=self.grammar_manager.stats() if self.grammar_manager is not None else None,
        )

    def check_invariants(self) -> None:
        check_kv_accounting(self.kv_pool, self.cache, self.req_to_token_pool, self.running)
