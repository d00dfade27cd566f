"""Linear layers for the CPU path: oneDNN-prepacked bf16 weights, batch-invariant rows.

Runs in the scheduler process.
- Prepacking: `torch.ops.mkldnn._reorder_linear_weight` lays a bf16 weight out in oneDNN's
  blocked format once at load time; measured on this machine for the default model's 30 layers,
  a decode step's matmuls took 15 ms instead of 21 ms at one row and 50 ms instead of 73 ms at 64
  rows, with bitwise the same results as `F.linear`.
- Batch invariance: seeded sampling must give the same text whatever else is in the batch, so a
  row must come out of every matmul bitwise the same alone or batched. Measured (torch 2.13,
  oneDNN bf16): every M >= 2 computes each row identically, a single row (M = 1) may not (K =
  1536), so one row is padded to two. MKL's float32 GEMM changes row results with M, so float32
  is exact but not batch-invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_PACK_BATCH_HINT = 2  # other hints (16, 64) made single rows differ from batched ones


def prepack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's blocked layout, or None where that path is unavailable."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_BATCH_HINT)
    except (RuntimeError, AttributeError):
        return None


def linear(
    x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None, bias=None
) -> torch.Tensor:
    """y = x W^T + b with the prepacked weight when there is one; one row is padded to two."""
    single = x.shape[0] == 1 and x.dtype == torch.bfloat16
    if single:
        x = torch.cat((x, x))
    if packed is not None:
        y = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    else:
        y = F.linear(x, weight, bias)
    return y[:1] if single else y


class Linear(nn.Linear):
    packed: torch.Tensor | None = None

    def prepack(self) -> None:
        """Call once the weights are loaded (and whenever they change)."""
        self.packed = prepack_weight(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.packed, self.bias)
