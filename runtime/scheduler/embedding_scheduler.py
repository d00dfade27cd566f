"""The scheduler of an embedding server: prefill-only requests, batched per step (scheduler
process).

Every step takes the waiting requests in arrival order up to `--max-prefill-tokens` input
tokens (at least one request), runs them as one batch through the runner (`EmbeddingRunner`
for encoders, `DecoderEmbeddingRunner` for decoders), and answers each with its vector (a
reranker's: its score): nothing outlives the step but a decoder runner's radix tree of
prompt prefixes (`DecoderEmbeddingRunner`; `/flush_cache` empties it), so there is nothing to
retract. Requests arriving while a step runs wait for the next one (continuous
batching at request granularity). A failure is contained to the step's requests (500s).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import deque

from radixgen.internal_state import EmbeddingSchedulerState
from radixgen.io_struct import (
    AbortReq,
    BatchEmbeddingOut,
    ControlOut,
    DashboardSnapshot,
    DashboardSnapshotOut,
    DashboardSnapshotReq,
    EmbeddingFailure,
    EmbeddingVector,
    FlushCacheOut,
    FlushCacheReq,
    GetInternalStateOut,
    GetInternalStateReq,
    MessageDispatch,
    SchedulerInbound,
    TokenizedEmbeddingReq,
)
from radixgen.runtime.model_executor.decoder_embedding_runner import DecoderEmbeddingRunner
from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob, EmbeddingRunner

logger = logging.getLogger(__name__)


class EmbeddingScheduler:
    """Queue of embedding requests and the step that serves them."""

    def __init__(
        self, runner: EmbeddingRunner | DecoderEmbeddingRunner, max_step_tokens: int
    ) -> None:
        self.runner = runner
        self.max_step_tokens = max(max_step_tokens, runner.max_input_tokens)
        self.waiting: deque[TokenizedEmbeddingReq] = deque()
        self.refused: list[tuple[TokenizedEmbeddingReq, str]] = []  # answered at the next step
        self.forward_steps = 0
        self.embedded_requests = 0
        self.prompt_tokens = 0
        self._dispatch = self._message_dispatch()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.refused)

    def handle(self, msg: SchedulerInbound) -> ControlOut | None:
        """Queue a request or apply an abort; answer a control request (its reply, else None).

        Raises UnknownMessageError for what an embedding server does not take (generate and
        LoRA requests)."""
        return self._dispatch(msg)

    def _message_dispatch(self) -> MessageDispatch[ControlOut | None]:
        return (
            MessageDispatch[ControlOut | None]("embedding scheduler")
            .on(TokenizedEmbeddingReq, self._on_request)
            .on(AbortReq, self._on_abort)
            .on(FlushCacheReq, self._on_flush_cache)
            .on(GetInternalStateReq, self._on_internal_state)
            .on(DashboardSnapshotReq, self._on_dashboard_snapshot)
        )

    def _on_request(self, msg: TokenizedEmbeddingReq) -> None:
        reason = self._refusal(msg)
        if reason is not None:
            self.refused.append((msg, reason))
        else:
            self.waiting.append(msg)

    def _on_abort(self, msg: AbortReq) -> None:
        if msg.abort_all:
            self.waiting.clear()
        else:
            self.waiting = deque(r for r in self.waiting if r.rid != msg.rid)

    def _on_flush_cache(self, msg: FlushCacheReq) -> FlushCacheOut:
        """A decoder embedder drops its cached prefixes (an encoder keeps none)."""
        freed = self.runner.flush_cache()
        return FlushCacheOut(True, f"freed {freed} cached tokens", request_id=msg.request_id)

    def _on_internal_state(self, msg: GetInternalStateReq) -> GetInternalStateOut:
        return GetInternalStateOut(self.internal_state(), request_id=msg.request_id)

    def _on_dashboard_snapshot(self, msg: DashboardSnapshotReq) -> DashboardSnapshotOut:
        """Its counters only: no decode steps, no request timelines kept, and no tree shown (a
        decoder embedder's prefix tree is counted in `cached_tokens`, not drawn)."""
        snap = DashboardSnapshot(
            time=time.time(),
            build_seconds=0.0,
            state=self.internal_state(),
            retracted_waiting=0,
            radix_enabled=False,
            tree_nodes=[],
            tree_truncated=False,
            steps=[],
            requests=[],
        )
        return DashboardSnapshotOut(snap, request_id=msg.request_id)

    def _refusal(self, req: TokenizedEmbeddingReq) -> str | None:
        """Why the request cannot run (the API process checks the same before sending)."""
        n, limit = len(req.input_ids), self.runner.max_input_tokens
        if n == 0:
            return "the input is empty"
        if n > limit:
            return f"the input has {n} tokens; this model takes at most {limit}"
        dims = req.dimensions
        if dims is not None and not 1 <= dims <= self.runner.hidden_size:
            return f"dimensions must be between 1 and {self.runner.hidden_size}"
        return None

    def step(self) -> list[BatchEmbeddingOut]:
        """Serve the refused requests and one batch of the waiting ones."""
        out = BatchEmbeddingOut([])
        for req, reason in self.refused:
            out.outputs.append(failure(req, reason, 400))
        self.refused = []
        batch: list[TokenizedEmbeddingReq] = []
        tokens = 0
        while self.waiting:
            n = len(self.waiting[0].input_ids)
            if batch and tokens + n > self.max_step_tokens:
                break
            batch.append(self.waiting.popleft())
            tokens += n
        if batch:
            try:
                jobs = [EmbeddingJob(r.input_ids, r.dimensions, r.token_type_ids) for r in batch]
                vectors = self.runner.embed(jobs)
            except Exception as e:  # NOTE: contained to this step's requests
                logger.error("embedding step failed: %r\n%s", e, traceback.format_exc())
                out.outputs += [failure(req, f"internal error: {e!r}", 500) for req in batch]
            else:
                self.forward_steps += 1
                self.embedded_requests += len(batch)
                self.prompt_tokens += tokens
                cached = self.runner.last_cached_tokens or [0] * len(batch)  # [] from encoders
                out.outputs += [
                    EmbeddingVector(req.rid, len(req.input_ids), vec.tolist(), n)
                    for req, vec, n in zip(batch, vectors, cached, strict=True)
                ]
        return [out] if out.outputs else []

    def fail_all(self, error: Exception) -> list[BatchEmbeddingOut]:
        """A failure outside the step's own containment: every queued request gets a 500."""
        queued = [*self.waiting, *(r for r, _ in self.refused)]
        out = BatchEmbeddingOut([failure(r, f"internal error: {error!r}", 500) for r in queued])
        self.waiting.clear()
        self.refused = []
        return [out] if out.outputs else []

    def internal_state(self) -> EmbeddingSchedulerState:
        return EmbeddingSchedulerState(
            waiting_requests=len(self.waiting),
            forward_steps=self.forward_steps,
            embedded_requests=self.embedded_requests,
            prompt_tokens=self.prompt_tokens,
            embedding_dim=self.runner.hidden_size,
            max_input_tokens=self.runner.max_input_tokens,
            cached_tokens=self.runner.cached_tokens,
        )


def failure(req: TokenizedEmbeddingReq, message: str, status: int) -> EmbeddingFailure:
    return EmbeddingFailure(req.rid, len(req.input_ids), message, status)
