"""RMS norms, plain and Gemma's (1 + w), with the optional fused add (scheduler process)."""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from radixgen.kernels.layer_ops import FusedLayerOps


class RMSNorm(nn.Module):
    """x / rms(x) * w; with a residual, a fused add + norm that also returns the new residual."""

    native: FusedLayerOps | None = None  # fused add + norm in one call (set by `prepack`)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Norm of x (+ residual); with a residual returns (normed, new residual) like a fused add-norm.

        NOTE: the residual stream is kept in float32 whatever the model dtype: over 30 layers bf16
        rounding of the running sum moves greedy choices at near-ties; the adds are cheap.
        """
        if self.native is not None and residual is not None:
            out = self.native.add_rmsnorm(x.contiguous(), residual, self.weight, self.eps)
            return out, residual  # the residual was updated in place
        if self.native is not None and x.dim() == 2 and x.is_cpu:
            # the native stack's layer-0 norm: its per-layer path is bitwise the stack's
            return self.native.add_rmsnorm(None, x.float().contiguous(), self.weight, self.eps)
        if residual is not None:
            x = residual + x.float()
            residual = x
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(self.weight.dtype)
        normed = normed * self.weight
        return normed if residual is None else (normed, residual)


class GemmaRMSNorm(RMSNorm):
    """x / rms(x) * (1 + w), in float32 (checkpoints store w around 0); never the fused kernel,
    which scales by w."""

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = residual + x.float()
            residual = x
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        normed = (normed * (1.0 + self.weight.float())).to(self.weight.dtype)
        return normed if residual is None else (normed, residual)
