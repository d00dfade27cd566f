"""A Linear layer whose per-row output does not depend on how many rows share the matmul.

Runs in the scheduler process. Seeded sampling must give the same text whatever else is in the
batch, so a decode row must come out of every matmul bitwise the same alone or batched.
Measured on this CPU stack (torch 2.13, oneDNN bf16): every M >= 2 computes each row identically,
but a single row (M = 1) takes another kernel with a different reduction order (K = 1536: the
MLP down projection). Padding one row to two costs one extra row of compute and makes decode and
prefill rows consistent. MKL's float32 GEMM has no such property (row results change with M), so
float32 is accurate but not batch-invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1 and x.dtype == torch.bfloat16:
            return F.linear(torch.cat((x, x)), self.weight, self.bias)[:1]
        return F.linear(x, self.weight, self.bias)
