"""Overlap scheduling: plan and launch step N+1 before handling step N's sampled tokens, so the
host work of a step (planning, admission, radix matching, output handling) runs while the device
computes the next one (scheduler process; a mixin of `Scheduler`).

One iteration of `_step_overlapped`:
  1. plan step N+1 over the running set as if step N's tokens were known: a request sampled at N
     has `pending_sample` set (its sequence is one token longer; that token reads as
     PENDING_TOKEN on the host and is taken from `future_ids`, on the device, at launch);
  2. launch N+1's forward (on a GPU the kernels are queued, nothing waits);
  3. handle step N: wait for its token ids (the step's one host synchronisation, its copy queued
     behind N's sampling), accept them, check finishes, release KV, queue outputs;
  4. sample N+1 (its penalties and seeds see N's tokens) and leave the ids in `future_ids`.
A request that finished at N may already sit in N+1: its token there is dropped (its KV slot
holds the KV of its last real token, which is valid). Outputs are identical with overlap on and
off; each token reaches the client one iteration later.

Steps fall back to the synchronous path (after handling the step in flight) when a grammar is
involved (its mask for N+1 and jump-forward need N's token on the host) or when the pool may be
too short for the decodes or a waiting request may preempt a running one (retraction must see
settled requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.device_io import to_device
from radixgen.runtime.scheduler.containment import log_internal_error
from radixgen.runtime.scheduler.output_processor import record_input_logprobs
from radixgen.runtime.scheduler.schedule_batch import (
    StepBatch,
    allocate_step_slots,
    build_step_batch,
)

if TYPE_CHECKING:
    from radixgen.io_struct import BatchTokenIDOut
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.model_executor.logits_output import LogitsOutput
    from radixgen.runtime.sampling.sampler import PendingSample, SampleOutput, Sampler
    from radixgen.runtime.scheduler.interfaces import StepRunner
    from radixgen.runtime.scheduler.req import Req


@dataclass
class InflightStep:
    """A launched step whose sampled tokens the host has not handled yet."""

    batch: StepBatch
    logits: LogitsOutput
    prompt_chunk: list[bool]  # per request: this step ran part of its prompt
    sample: PendingSample | None = None


class OverlapScheduling:
    """The overlapped step; `Scheduler.__init__` sets every attribute below."""

    model_runner: StepRunner
    kv_pool: TokenToKVPool
    req_to_token_pool: ReqToTokenPool
    cache: BasePrefixCache
    sampler: Sampler
    running: list[Req]
    waiting: list[Req]
    grammar_waiting: list[Req]
    outbox: list[Req]
    page_size: int
    forward_steps: int
    future_ids: torch.Tensor  # [request slots] the last token sampled for each, on the device
    inflight: InflightStep | None

    if TYPE_CHECKING:  # the Scheduler's own methods this mixin calls

        def _poll_grammars(self) -> None: ...
        def _plan_step_contained(self) -> list[Req]: ...
        def _fail(self, reqs: list[Req], e: Exception) -> None: ...
        def _release(self, req: Req) -> None: ...
        def _accept_all(
            self, reqs: list[Req], out: SampleOutput, skip: set[int] | None = None
        ) -> None: ...
        def _after_step(self, plan: list[Req]) -> None: ...
        def _forward(self, batch: ForwardBatch) -> LogitsOutput: ...
        def _resolve(self, pending: PendingSample) -> SampleOutput: ...
        def _collect_outputs(self) -> list[BatchTokenIDOut]: ...
        def _free_tokens(self, needed: int) -> bool: ...
        def _pages(self, reqs: list[Req], n: int) -> int: ...
        def _preemption_candidate(self) -> Req | None: ...
        def _step_sync(self) -> list[BatchTokenIDOut]: ...

    def _step_overlapped(self) -> list[BatchTokenIDOut]:
        self._poll_grammars()
        if self._needs_sync():
            self.finish_inflight()
            return self._step_sync()
        plan = self._plan_step_contained()
        launched = None
        if plan:
            try:
                launched = self._launch(plan)
            except Exception as e:  # NOTE: the loop must survive; fail this batch's requests only
                log_internal_error("the forward step", e)
                self._fail(plan, e)
        self.finish_inflight()
        if launched is not None:
            try:
                self._sample(launched)
                self.inflight = launched
            except Exception as e:
                log_internal_error("sampling", e)
                self._fail(launched.batch.reqs, e)
        if plan:
            self._after_step(plan)
        return self._collect_outputs()

    def _needs_sync(self) -> bool:
        """Whether this step must see every sampled token on the host before it is planned."""
        if self.grammar_waiting or any(
            r.grammar is not None or r.constrained for r in (*self.running, *self.waiting)
        ):
            return True
        if self._preemption_candidate() is not None:
            return True  # a preemption retracts, and retraction must see settled requests
        decodes = [r for r in self.running if r.pending_len == 1]
        return bool(decodes) and not self._free_tokens(self._pages(decodes, 1) * self.page_size)

    def _launch(self, plan: list[Req]) -> InflightStep:
        """Allocate, build and launch the forward of `plan`; pending tokens are read on the device."""
        slots = allocate_step_slots(plan, self.kv_pool, self.req_to_token_pool.req_to_token)
        assert slots is not None, "planner admitted more tokens than the pool holds"
        try:
            batch = build_step_batch(plan, slots, self.req_to_token_pool)
            fb = batch.forward
            pending = [
                (start + n - 1, row)
                for r, row, start, n in zip(
                    plan, fb.req_pool_indices_cpu, fb.extend_start_loc, fb.extend_lens, strict=True
                )
                if r.pending_sample
            ]
            dev = self.future_ids.device
            fb = fb.to_device(dev)
            if pending:
                where = to_device([p for p, _ in pending], torch.long, dev)
                rows = to_device([row for _, row in pending], torch.long, dev)
                fb.input_ids[where] = self.future_ids[rows]
            logits = self._forward(fb)
        except Exception:
            self.kv_pool.free(slots)  # nobody owns this step's slots yet
            raise
        prompt_chunk = [r.extend_len > 1 and r.kv_len < len(r.origin_input_ids) for r in batch.reqs]
        for r in batch.reqs:
            r.kv_len += r.extend_len
        return InflightStep(batch, logits, prompt_chunk)

    def _sample(self, step: InflightStep) -> None:
        """Sample the launched step; its ids stay on the device for the next step's inputs."""
        # NOTE: before the next launch: a CUDA-graph replay reuses the memory of these logits
        record_input_logprobs(step.batch, step.logits)
        reqs = step.batch.sampling_reqs
        if not reqs:
            return
        step.sample = self.sampler.launch(step.logits, step.batch.sample_rows, reqs)
        # NOTE: only requests still running: one that finished since the launch holds no row
        live = [
            (i, r, r.req_pool_idx)
            for i, r in enumerate(reqs)
            if not r.finished and r.req_pool_idx is not None
        ]
        if not live:
            return
        dev = self.future_ids.device
        ids = step.sample.device_ids.to(dev)
        if len(live) < len(reqs):
            ids = ids[to_device([i for i, _, _ in live], torch.long, dev)]
        self.future_ids[to_device([row for _, _, row in live], torch.long, dev)] = ids
        for _, r, _ in live:
            r.pending_sample = True

    def finish_inflight(self) -> None:
        """Handle the step in flight, if any: accept its tokens and finish, release or stream its
        requests (those that finished or were aborted since its launch are skipped)."""
        step, self.inflight = self.inflight, None
        if step is None:
            return
        batch = step.batch
        settled = {id(r) for r in batch.reqs if r.finished}  # handled when they finished
        try:
            out = self._resolve(step.sample) if step.sample is not None else None
        except Exception as e:  # NOTE: fail this batch's requests only
            log_internal_error("the step's results", e)
            for r in batch.reqs:
                r.pending_sample = False
            self._fail(batch.reqs, e)
            return
        if out is not None:
            for r in batch.sampling_reqs:
                r.pending_sample = False
            # a request that finished before its token arrived drops the token
            self._accept_all(batch.sampling_reqs, out, skip=settled)
        for r, chunk in zip(batch.reqs, step.prompt_chunk, strict=True):
            if id(r) in settled:
                continue
            if r.finished:
                self._release(r)
            elif chunk and r.req_pool_idx is not None:
                self.cache.cache_unfinished_req(r)  # share the prompt (chunk) with later requests
            r.steps_since_stream += 1
            self.outbox.append(r)
