"""Gated feed-forward blocks: SiLU (SwiGLU) and tanh-GELU (GeGLU) over a fused gate/up matmul
(scheduler process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.layers.linear import Linear

if TYPE_CHECKING:
    from radixgen.kernels.layer_ops import FusedLayerOps
    from radixgen.runtime.models.model_config import ModelArchConfig


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    native: FusedLayerOps | None = None  # silu(gate) * up in one call (set by `prepack`)

    def __init__(self, cfg: ModelArchConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        self.inter = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, bias=cfg.mlp_bias)
        self.down_proj = Linear(self.inter, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:  # float32 between the two matmuls (see Attention.forward)
            gate_up = self.gate_up_proj.forward(x, unrounded=True)
            return self.down_proj.forward(self.native.silu_mul(gate_up, x.dtype), unrounded=True)
        gate_up = self.gate_up_proj.forward(x)
        gate, up = gate_up.split(self.inter, dim=-1)  # type: ignore[no-untyped-call]  # unannotated in torch
        return self.down_proj.forward(F.silu(gate) * up)


class GeluTanhMLP(MLP):
    """Gemma 2's GeGLU: down(gelu_tanh(gate(x)) * up(x)), always on torch ops (the fused kernel
    is SiLU's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).split(self.inter, dim=-1)  # type: ignore[no-untyped-call]
        return self.down_proj.forward(F.gelu(gate, approximate="tanh") * up)
