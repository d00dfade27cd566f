"""Fused residual add + RMSNorm: the float32 residual stream is updated in place and normed.

One program per token row; the row is one block (hidden sizes up to 64k). Numerics are the
native CPU kernel's (kernels/cpu/fused_ops.c, `add_rmsnorm`): residual += x in float32, then
norm(residual) in float32, rounded to the weight's dtype before the weight multiplies it, as
`F.rms_norm(residual).to(w.dtype) * w` does in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import round_bf16, store_as

MAX_HIDDEN = 1 << 16


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    hidden,
    eps,
    HAS_X: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * hidden
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    r = tl.load(residual_ptr + row + cols, mask=mask, other=0.0)
    if HAS_X:
        r = r + tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(residual_ptr + row + cols, r, mask=mask)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = r * inv
    if out_ptr.dtype.element_ty == tl.bfloat16:
        normed = round_bf16(normed)
    store_as(out_ptr + row + cols, normed * w, mask)


def add_rmsnorm(
    x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x (in place, float32); returns norm(residual) * weight in weight's dtype.

    residual: float32 [N, H] contiguous; x: None (norm only) or [N, H] contiguous in weight's
    dtype or float32; weight: [H] float32 or bf16.
    """
    n, hidden = residual.shape
    assert residual.dtype == torch.float32 and residual.is_contiguous()
    assert weight.dtype in (torch.float32, torch.bfloat16) and weight.shape == (hidden,)
    assert x is None or (
        x.is_contiguous() and x.shape == residual.shape and x.dtype in (weight.dtype, torch.float32)
    )
    assert hidden <= MAX_HIDDEN, f"hidden size {hidden} is over one block ({MAX_HIDDEN})"
    out = torch.empty((n, hidden), dtype=weight.dtype, device=residual.device)
    if n == 0:
        return out
    block = triton.next_power_of_2(hidden)
    _add_rmsnorm_kernel[(n,)](
        residual if x is None else x,  # never read without HAS_X
        residual,
        weight,
        out,
        hidden,
        float(eps),
        HAS_X=x is not None,
        BLOCK=block,
        num_warps=min(max(block // 256, 1), 16),
    )
    return out
