"""DP attention (`--enable-dp-attention`): attention data-parallel, the MLP tensor-parallel.

Runs in every scheduler process of the group. Each rank is a whole scheduler of its own (own
requests, KV pool and radix cache, fed by the DP controller) and keeps the whole attention,
embedding and LM head; only the MLP is split, 1/tp of its columns per rank. Around each MLP the
ranks' hidden rows are gathered (padded to the largest rank's count, cut back by the counts),
every rank runs its MLP columns over all of them, and a sum over ranks gives each rank the full
MLP output, of which it keeps its own rows.

NOTE: every forward starts with an all-gather of each rank's token count. A rank whose loop
iteration ran no forward joins it with 0 (`DPAttentionSync.end_iteration`) and, when another
rank has tokens, runs an idle forward: the MLP collectives alone, over no rows of its own. When
every rank has 0, nobody runs anything. So the collectives line up whatever the batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from radixgen.runtime.distributed.parallel_state import TensorParallelGroup


@dataclass
class StepCounts:
    """This step's token count per rank (shared by the MLP wrappers of one model)."""

    rank: int
    counts: list[int] = field(default_factory=list)

    @property
    def offset(self) -> int:
        return sum(self.counts[: self.rank])


class DPAttentionMLP(nn.Module):
    """A rank's MLP columns over every rank's rows; returns this rank's rows of the full MLP."""

    def __init__(self, inner: nn.Module, tp: TensorParallelGroup, step: StepCounts) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counts = self.step.counts
        widest = max(counts)
        padded = x.new_zeros(widest, x.shape[-1])
        padded[: x.shape[0]] = x
        parts = self.tp.all_gather(padded)
        rows = torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)])
        y: torch.Tensor = self.inner.forward(rows)
        total = self.tp.all_reduce(y.float())  # NOTE: float32 sum (see RowParallelLinear)
        own = total[self.step.offset : self.step.offset + x.shape[0]]
        return own.to(y.dtype)


class DPAttentionSync:
    """Keeps one rank's forwards in step with the group's (see the module docstring)."""

    def __init__(self, tp: TensorParallelGroup) -> None:
        self.tp = tp
        self.step = StepCounts(tp.rank)
        self.forwarded = False  # a forward ran in this loop iteration
        self.idle_forwards = 0

    def gather_counts(self, num_tokens: int) -> list[int]:
        t = torch.tensor([num_tokens], dtype=torch.long)
        self.step.counts = [int(p.item()) for p in self.tp.all_gather(t)]
        return self.step.counts

    def before_forward(self, num_tokens: int) -> None:
        self.gather_counts(num_tokens)
        self.forwarded = True

    def end_iteration(self, model: nn.Module, hidden: int, dtype: torch.dtype) -> None:
        """Once per scheduler loop iteration, after its step: an iteration that ran no forward
        joins the count gather with 0, and runs the idle forward when another rank has tokens."""
        if self.forwarded:
            self.forwarded = False
            return
        if any(self.gather_counts(0)):
            empty = torch.empty(0, hidden, dtype=dtype)
            for layer in model.layers:  # type: ignore[union-attr]
                layer.mlp.forward(empty)
            self.idle_forwards += 1


def parallelize_dp_attention(model: nn.Module, tp: TensorParallelGroup) -> DPAttentionSync:
    """Wrap a rank's loaded decoder (whole attention, 1/tp of the MLP) for DP attention."""
    sync = DPAttentionSync(tp)
    for layer in model.layers:  # type: ignore[union-attr]
        layer.mlp = DPAttentionMLP(layer.mlp, tp, sync.step)
    return sync
