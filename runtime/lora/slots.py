"""One linear layer's LoRA slots and their batched application (scheduler process).

Each slot holds one adapter's factors for this layer, padded to the pool's rank: A stacked over
the shards of a fused output ([slots, shards * R, in]) and B block-diagonal ([slots, out,
shards * R]), so the q, k and v adapters of the fused qkv matmul (gate and up of gate_up) are one
GEMM pair per adapter: x A^T gives every shard's rank-R projection, and each B block writes only
its own slice of the fused output. A step's rows are grouped by slot once (`LoraStepRows`, shared
by every layer); each group costs one GEMM pair per layer, never one per request. Where the
groups' rows are not one contiguous run each (requests of several adapters interleaved in the
batch), the step gathers every adapter row once in slot order, so a layer makes one gather and
one scatter-add whatever the number of groups (the scatter-add in bf16 is the costly part on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoraStepRows:
    """The current step's token rows by adapter slot (set by the manager around a forward; empty
    outside one, so a layer adds nothing).

    order None: each group's rows are a slice of the step's tokens. Otherwise `order` lists the
    adapter rows grouped by slot and each group's rows are a slice of that order."""

    groups: list[tuple[int, slice]] = field(default_factory=list)
    order: torch.Tensor | None = None

    def set(self, spans: dict[int, list[tuple[int, int]]], device: torch.device) -> None:
        """Group the token spans [start, end) of each slot's requests."""
        merged = {slot: _merge(s) for slot, s in spans.items()}
        if all(len(m) == 1 for m in merged.values()):
            self.groups = [(slot, slice(*m[0])) for slot, m in merged.items()]
            self.order = None
            return
        groups, parts, start = [], [], 0
        for slot, ranges in merged.items():
            n = sum(hi - lo for lo, hi in ranges)
            groups.append((slot, slice(start, start + n)))
            parts += [torch.arange(lo, hi) for lo, hi in ranges]
            start += n
        self.groups, self.order = groups, torch.cat(parts).to(device)

    def clear(self) -> None:
        self.groups, self.order = [], None


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans that touch end to end joined into one."""
    merged = [spans[0]]
    for lo, hi in spans[1:]:
        if lo == merged[-1][1]:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


class LoraLinearSlots:
    """The slots of one (possibly fused) linear layer; attached as its `Linear.delta`."""

    def __init__(
        self,
        rows: LoraStepRows,
        shard_bounds: list[int],
        in_features: int,
        num_slots: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.rows = rows
        self.bounds = shard_bounds  # [0, end of shard 0, ..., out_features]
        self.rank = rank
        shards = len(shard_bounds) - 1
        out = shard_bounds[-1]
        # NOTE: on CPU the factors and their GEMMs are float32 whatever the model dtype: torch's
        # bf16 matmul without native bf16 units is ~16x slower (measured on AVX2: 3.5 ms vs 0.21
        # ms for a 64-row qkv pair), the factors are small, and float32 is also closer to peft
        if device.type == "cpu":
            dtype = torch.float32
        self.a = torch.zeros(num_slots, shards * rank, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, out, shards * rank, dtype=dtype, device=device)
        self.scaling = [0.0] * num_slots

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.scaling[slot] = 0.0

    def write(
        self, slot: int, shard: int | None, a: torch.Tensor, b: torch.Tensor, scaling: float
    ) -> None:
        """Put one module's A [r, in] and B [out of its shard, r] into `slot` (shard None: the
        whole output, one shard)."""
        k = 0 if shard is None else shard
        r = a.shape[0]
        lo, hi = (0, self.bounds[-1]) if shard is None else (self.bounds[k], self.bounds[k + 1])
        self.a[slot, k * self.rank : k * self.rank + r].copy_(a)
        self.b[slot, lo:hi, k * self.rank : k * self.rank + r].copy_(b)
        self.scaling[slot] = scaling

    def add_to(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + (x A^T B^T) * scaling for each group of rows (PEFT's unmerged order of ops)."""
        order = self.rows.order
        if order is None:
            for slot, rows in self.rows.groups:
                scaling = self.scaling[slot]
                if scaling == 0.0:  # this adapter does not target this layer
                    continue
                a, b = self.a[slot], self.b[slot]
                d = torch.mm(torch.mm(x[rows].to(a.dtype), a.t()), b.t()).mul_(scaling)
                y[rows] += d.to(y.dtype)
            return y
        xs = x.index_select(0, order).to(self.a.dtype)
        ds = torch.empty(order.numel(), y.shape[1], dtype=self.a.dtype, device=y.device)
        for slot, rows in self.rows.groups:
            scaling = self.scaling[slot]
            if scaling == 0.0:
                ds[rows].zero_()
                continue
            a, b = self.a[slot], self.b[slot]
            torch.mm(torch.mm(xs[rows], a.t()), b.t(), out=ds[rows]).mul_(scaling)
        return y.index_add_(0, order, ds.to(y.dtype))
