"""SiLU-and-mul over fused [gate | up] rows: the MLP's activation in one pass.

Numerics are the native CPU kernel's (kernels/cpu/fused_ops.c, `silu_mul`): silu in float32;
bf16 in and out rounds silu(gate) to bf16 before the product, as `F.silu(gate) * up` does in
torch; float32 in rounds the product once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import round_bf16, store_as

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,
    out_ptr,
    inter,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    src = gate_up_ptr + row * 2 * inter + cols
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + inter, mask=mask, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp(-g))
    if gate_up_ptr.dtype.element_ty == tl.bfloat16:
        if out_ptr.dtype.element_ty == tl.bfloat16:
            act = round_bf16(act)
    store_as(out_ptr + row * inter + cols, act * u, mask)


def silu_mul(gate_up: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] rows [N, 2I] (contiguous), as [N, I] in
    out_dtype (default: gate_up's); float32 or bf16 in and out."""
    n, two_i = gate_up.shape
    assert gate_up.is_contiguous() and two_i % 2 == 0
    out_dtype = out_dtype or gate_up.dtype
    assert {gate_up.dtype, out_dtype} <= {torch.float32, torch.bfloat16}
    inter = two_i // 2
    out = torch.empty((n, inter), dtype=out_dtype, device=gate_up.device)
    if n == 0 or inter == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(inter))
    _silu_mul_kernel[(n, triton.cdiv(inter, block))](
        gate_up, out, inter, BLOCK=block, num_warps=min(max(block // 256, 1), 8)
    )
    return out
