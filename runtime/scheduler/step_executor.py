"""Launch a planned step: allocate its KV slots, build its batch, run (on a GPU: queue) its
forward, and launch its sampling (scheduler process).

The executor returns a `LaunchedStep`, a handle whose tokens may still be on the device; the
result processor commits it. Both scheduling modes launch through here: synchronous steps commit
the handle at once, overlapped ones one iteration later, after the next step is launched. An
overlapped step's input tokens sampled by the step still in flight are read on the device from
`future_ids` (a request's row holds the last token sampled for it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.device_io import to_device
from radixgen.runtime.scheduler.draft_planner import allocate_branches
from radixgen.runtime.scheduler.output_processor import record_input_logprobs
from radixgen.runtime.scheduler.schedule_batch import (
    StepBatch,
    allocate_step_slots,
    build_step_batch,
)

if TYPE_CHECKING:
    from radixgen.internal_state import SchedulerCounters
    from radixgen.kernels.step_cancel import CancelFlag
    from radixgen.runtime.constrained.grammar_manager import GrammarManager
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.model_executor.logits_output import LogitsOutput
    from radixgen.runtime.sampling.sampler import PendingSample, SampleOutput, Sampler
    from radixgen.runtime.scheduler.interfaces import StepRunner
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.scheduler.step_plan import StepPlan


@dataclass
class LaunchedStep:
    """A step whose forward is launched and whose results are not committed yet. Its requests'
    `kv_len` already count its tokens: the slots are theirs."""

    batch: StepBatch
    logits: LogitsOutput
    started: float  # perf_counter() at launch: the step-cost model's measure
    branch_rows: list[int] = field(default_factory=list)  # draft branches' spare request rows
    sample: PendingSample | None = None
    # requests whose token this step drops: the previous step's commit changed their sequence
    # after the token this step ran (jump-forward, a rollback), so its logits are stale
    stale: frozenset[int] = frozenset()
    overlapped: bool = False  # committed after the next step's launch (its ids in `future_ids`)

    @property
    def plan(self) -> StepPlan:
        return self.batch.plan


class StepExecutor:
    def __init__(
        self,
        model_runner: StepRunner,
        sampler: Sampler,
        stats: SchedulerCounters,
    ) -> None:
        self.model_runner = model_runner
        self.kv_pool: TokenToKVPool = model_runner.kv_pool
        self.req_to_token_pool: ReqToTokenPool = model_runner.req_to_token_pool
        self.sampler = sampler
        self.stats = stats
        # [request rows] the last token sampled for each, on the device (overlapped steps)
        self.future_ids = torch.zeros(
            self.req_to_token_pool.size, dtype=torch.long, device=self.req_to_token_pool.device
        )
        self.future_written = False  # some step left its ids on the device (overlap)

    def launch(self, plan: StepPlan, cancel: CancelFlag | None = None) -> LaunchedStep:
        """Allocate, build and launch the forward of `plan`. Tokens still in flight for its
        requests (`pending_sample`) are read on the device. When the launch raises (a
        StepCancelled too, when `cancel` is set while the forward runs), the step's slots and
        branch rows are freed (nobody owns them yet) and the request state is as planned."""
        t0 = time.perf_counter()
        pool = self.req_to_token_pool
        slots = allocate_step_slots(plan, self.kv_pool, pool.req_to_token)
        assert slots is not None, "planner admitted more tokens than the pool holds"
        branch_slots: torch.Tensor | None = None
        branch_rows: list[int] = []
        try:
            if plan.drafted:
                branch_slots, branch_rows = allocate_branches(plan, self.kv_pool, pool)
            batch = build_step_batch(plan, slots, pool, branch_slots)
            fb = batch.forward
            fb.cancel = cancel
            # the rows whose last input token is still in flight (their requests' rows come
            # first: draft branches' pseudo-requests never wait for a token)
            pending: list[tuple[int, int]] = []
            if self.future_written:  # a step left its ids on the device: inputs may be pending
                pending = [
                    (start + n - 1, row)
                    for r, row, start, n in zip(
                        batch.reqs,
                        fb.req_pool_indices_cpu[: len(batch.reqs)],
                        fb.extend_start_loc,
                        fb.extend_lens,
                        strict=False,
                    )
                    if r.pending_sample
                ]
            if pending:
                dev = self.future_ids.device
                fb = fb.to_device(dev)
                where = to_device([p for p, _ in pending], torch.long, dev)
                rows = to_device([row for _, row in pending], torch.long, dev)
                fb.input_ids[where] = self.future_ids[rows]
            logits = self._forward(fb)
        except Exception:
            self.kv_pool.free(slots)
            if branch_slots is not None:
                self.kv_pool.free(branch_slots)
            for row in branch_rows:
                pool.free(row)
            raise
        for r, n in zip(plan.reqs, plan.extend_lens, strict=True):
            r.kv_len += n
        return LaunchedStep(batch, logits, t0, branch_rows)

    def sample(
        self,
        step: LaunchedStep,
        grammars: GrammarManager | None,
        keep_on_device: bool,
        stale: set[int] | None = None,
    ) -> None:
        """Record the step's prompt logprobs and launch its sampling (under the grammar mask of
        constrained requests). `keep_on_device`: the ids also go to `future_ids` and the
        requests still running are marked `pending_sample`, for a step launched before this one
        is committed. `stale`: ids of requests whose sequence changed since the launch (their
        token is drawn but dropped: `LaunchedStep.stale`)."""
        step.overlapped = keep_on_device
        # NOTE: before the next launch: a CUDA-graph replay reuses the memory of these logits
        record_input_logprobs(step.batch, step.logits)
        reqs = step.batch.sampling_reqs
        if not reqs:
            return
        if stale:
            step.stale = frozenset(id(r) for r in reqs if id(r) in stale)
        mask = rows = None
        if grammars is not None and any(r.grammar is not None for r in reqs):
            mask, rows = self._grammar_mask(grammars, reqs, step.stale)
        step.sample = self.sampler.launch(step.logits, step.batch.sample_rows, reqs, mask, rows)
        if not keep_on_device:
            return
        # NOTE: only requests still running whose token counts: one that finished since the
        # launch holds no row, a stale one drops its token
        live = [
            (i, r, r.req_pool_idx)
            for i, r in enumerate(reqs)
            if not r.finished and r.req_pool_idx is not None and id(r) not in step.stale
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
        self.future_written = True

    @staticmethod
    def _grammar_mask(
        grammars: GrammarManager, reqs: list[Req], dropped: frozenset[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The grammar masks of the rows whose token counts: a request that finished or went
        stale since the launch keeps no mask (its grammar has moved on; its token is dropped)."""
        if not dropped and not any(r.finished for r in reqs):
            return grammars.fill_mask(reqs)
        keep = [i for i, r in enumerate(reqs) if not r.finished and id(r) not in dropped]
        mask, rows = grammars.fill_mask([reqs[i] for i in keep])
        return mask, torch.tensor([keep[j] for j in rows.tolist()], dtype=torch.long)

    def resolve(self, pending: PendingSample) -> SampleOutput:
        """The sampled tokens on the host (the step's one wait for the device), timed."""
        t0 = time.perf_counter()
        out = pending.resolve()
        self.stats.device_wait_seconds += time.perf_counter() - t0
        return out

    def _forward(self, batch: ForwardBatch) -> LogitsOutput:
        """The model runner's forward (on a GPU: its launch), timed."""
        t0 = time.perf_counter()
        logits = self.model_runner.forward(batch)
        self.stats.forward_seconds += time.perf_counter() - t0
        return logits
