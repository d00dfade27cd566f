"""Rotary embedding of q and k from a fused qkv row, with k and v stored straight into the KV
pool: one pass per token instead of split, rotate, concatenate and a scatter per layer.

Half-split (NeoX) layout with the float32 cos/sin tables of runtime/layers' `RotaryEmbedding`
([max positions, D], each half repeated). Numerics are the native CPU kernel's
(kernels/cpu/fused_ops.c, `rope_store_kv`): bf16 in and out rounds the tables, each product and
the sum, exactly as `x * cos + rotate_half(x) * sin` in bf16 torch; float32 in (an unrounded
projection) rotates in float32 and rounds each output once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import round_bf16, store_as


@triton.jit
def _rotate(x, partner, c, s, BF16_MATH: tl.constexpr):
    """x * cos + rotate_half(x) * sin, partner already signed (-x2 | x1)."""
    if BF16_MATH:
        return round_bf16(x * c) + round_bf16(partner * s)
    else:
        return x * c + partner * s


@triton.jit
def _rope_store_kv_kernel(
    qkv_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_pool_ptr,
    v_pool_ptr,
    loc_ptr,
    stride_qkv,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BF16_MATH: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + n).to(tl.int64)
    loc = tl.load(loc_ptr + n).to(tl.int64)
    half = HEAD_DIM // 2
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    first = d < half
    partner = tl.where(first, d + half, d - half)
    sign = tl.where(first, -1.0, 1.0)
    c = tl.load(cos_ptr + pos * HEAD_DIM + d, mask=d_mask, other=0.0)
    s = tl.load(sin_ptr + pos * HEAD_DIM + d, mask=d_mask, other=0.0)
    if BF16_MATH:
        c = round_bf16(c)
        s = round_bf16(s)
    row = qkv_ptr + n * stride_qkv

    h = tl.arange(0, BLOCK_H)
    mask = (h < HEADS)[:, None] & d_mask[None, :]
    src = row + h[:, None] * HEAD_DIM
    x = tl.load(src + d[None, :], mask=mask, other=0.0).to(tl.float32)
    p = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32) * sign[None, :]
    q = _rotate(x, p, c[None, :], s[None, :], BF16_MATH)
    store_as(q_ptr + (n * HEADS + h[:, None]) * HEAD_DIM + d[None, :], q, mask)

    hk = tl.arange(0, BLOCK_KV)
    mask = (hk < KV_HEADS)[:, None] & d_mask[None, :]
    src = row + (HEADS + hk[:, None]) * HEAD_DIM
    dst = (loc * KV_HEADS + hk[:, None]) * HEAD_DIM + d[None, :]
    x = tl.load(src + d[None, :], mask=mask, other=0.0).to(tl.float32)
    p = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32) * sign[None, :]
    store_as(k_pool_ptr + dst, _rotate(x, p, c[None, :], s[None, :], BF16_MATH), mask)
    v = tl.load(src + KV_HEADS * HEAD_DIM + d[None, :], mask=mask, other=0.0).to(tl.float32)
    store_as(v_pool_ptr + dst, v, mask)


def rope_store_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    out_cache_loc: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Rotated q [N, H, D]; rotated k and v written into the pools at `out_cache_loc`.

    qkv: [N, (H + 2 Hkv) D] rows (row stride free, unit column stride), in the pools' dtype or
    float32; positions, out_cache_loc: [N] long; cos, sin: float32 [max positions, D]
    contiguous; k_pool, v_pool: [slots, Hkv, D] contiguous, float32 or bf16. q has the pools'
    dtype. Slots not in `out_cache_loc` are not touched.
    """
    n = qkv.shape[0]
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(1) == 1
    assert positions.dtype == torch.long and out_cache_loc.dtype == torch.long
    assert cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
    assert cos.shape[1] == head_dim and head_dim % 2 == 0
    assert k_pool.is_contiguous() and v_pool.is_contiguous() and v_pool.dtype == k_pool.dtype
    assert k_pool.shape[1:] == (num_kv_heads, head_dim) and v_pool.shape == k_pool.shape
    assert k_pool.dtype in (torch.float32, torch.bfloat16)
    assert qkv.dtype in (k_pool.dtype, torch.float32)
    assert positions.device == out_cache_loc.device == cos.device == k_pool.device == qkv.device, (
        "qkv, positions, out_cache_loc, the tables and the pools must be on one device"
    )
    q = torch.empty((n, num_heads, head_dim), dtype=k_pool.dtype, device=qkv.device)
    if n == 0:
        return q
    block_d = triton.next_power_of_2(head_dim)
    block_h = triton.next_power_of_2(num_heads)
    _rope_store_kv_kernel[(n,)](
        qkv,
        positions,
        cos,
        sin,
        q,
        k_pool,
        v_pool,
        out_cache_loc,
        qkv.stride(0),
        HEADS=num_heads,
        KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=block_h,
        BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=block_d,
        BF16_MATH=qkv.dtype == k_pool.dtype == torch.bfloat16,
        num_warps=min(max(block_h * block_d // 512, 1), 8),
    )
    return q
