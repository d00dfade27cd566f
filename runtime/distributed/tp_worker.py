"""How the ranks of one tensor-parallel group run the same steps (every scheduler rank process).

NOTE: the decision. Rank 0 alone runs the scheduler (ZMQ input, queues, radix cache, grammar,
sampling, output); each step it broadcasts the planned batch (the ForwardBatch plus the KV slot
rows of its requests) and every rank runs that forward on its shard. The other ranks keep no
queue or cache of their own, so nothing they do can drift from rank 0's choices (grammar
compiles finishing at different times, clocks, RNG): the schedule is identical by construction.
Rank 0 gathers the full logits and samples alone; only it sends tokens to the detokenizer.
When it has nothing to run it still broadcasts an empty step at least every `KEEPALIVE_S`, so a
rank waiting for the next step tells a quiet server from a dead or stuck rank 0 by the
collective timeout (`--dist-timeout`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import torch

from radixgen.runtime.distributed.parallel_state import TensorParallelGroup

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

KEEPALIVE_S = 1.0
FORWARD, IDLE, STOP = "forward", "idle", "stop"


def slot_positions(batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(request slot, position) of every KV entry the step reads: each request's positions
    [0, prefix + extend), flattened in batch order (no Python loop over the requests)."""
    ends = torch.tensor(batch.prefix_lens, dtype=torch.long) + torch.tensor(
        batch.extend_lens, dtype=torch.long
    )
    rows = torch.repeat_interleave(torch.tensor(batch.req_pool_indices_cpu, dtype=torch.long), ends)
    starts = torch.cumsum(ends, 0) - ends
    cols = torch.arange(int(ends.sum())) - torch.repeat_interleave(starts, ends)
    return rows, cols


class StepChannel:
    """Rank 0's side: one broadcast per step (or per idle second)."""

    def __init__(self, tp: TensorParallelGroup) -> None:
        assert tp.is_first
        self.tp = tp
        self._last = -KEEPALIVE_S  # the first loop iteration sends one at once
        self.steps = 0

    def send_forward(self, batch: ForwardBatch, pool: ReqToTokenPool) -> None:
        """The batch and, per request, its KV slots up to the end of this step's tokens (the
        other ranks have no scheduler that would have written them)."""
        rows, cols = slot_positions(batch)
        slots = pool.req_to_token[rows, cols]
        self.tp.broadcast_obj((FORWARD, dataclasses.replace(batch, attn_backend=None), slots))
        self._last = time.monotonic()
        self.steps += 1

    def keepalive(self) -> None:
        """An empty step when none was sent for `KEEPALIVE_S` (called every loop iteration)."""
        if time.monotonic() - self._last >= KEEPALIVE_S:
            self.tp.broadcast_obj((IDLE,))
            self._last = time.monotonic()

    def stop(self) -> None:
        self.tp.broadcast_obj((STOP,))


def run_follower(runner: ModelRunner, tp: TensorParallelGroup) -> None:
    """Ranks 1..T-1: run every step rank 0 sends until it says stop (a broken or timed-out
    collective raises `CollectiveError` out of here)."""
    pool = runner.req_to_token_pool
    while True:
        msg = tp.broadcast_obj()
        kind = msg[0]
        if kind == FORWARD:
            _, batch, slots = msg
            rows, cols = slot_positions(batch)
            pool.write(rows, cols, slots)
            runner.forward(batch)
        elif kind == STOP:
            logger.info("rank 0 stopped the group")
            return
