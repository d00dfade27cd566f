"""Paged decode attention in two stages: split-KV partials, then a log-sum-exp reduction.

One program of the first stage takes one request, one KV head and one split of that request's
keys; the query heads that share the KV head (the GQA group) ride in one `tl.dot` block, so each
key and value is read once per group. A request's split boundaries depend only on its own
length, never on the batch, so its output does not change with what it is batched with.
Keys are read through `req_to_token` (request row -> KV slot per position): no per-step index
list is built. The split count is fixed, so the launch grid depends on the batch size alone and
a CUDA graph captures it as it is (with preallocated partials: `mid`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import dot, exact_dots, soft_cap

NUM_SPLITS = 8  # a power of two (the reduction loads all splits as one block)
BLOCK_N = 32


@triton.jit
def _decode_partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    seq_lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_r2t,
    scaling,
    window,
    softcap,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP

    seq_len = tl.load(seq_lens_ptr + b)
    row = tl.load(req_rows_ptr + b).to(tl.int64)
    lo = 0
    if window > 0:
        lo = tl.maximum(seq_len - window, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    h_off = tl.arange(0, BLOCK_H)
    h_mask = h_off < GROUP
    heads = kv_head * GROUP + h_off
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=h_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        slots = tl.load(req_to_token_ptr + row * stride_r2t + pos, mask=p_mask, other=0).to(
            tl.int64
        )
        kv_mask = p_mask[:, None] & d_mask[None, :]
        k = tl.load(
            k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = dot(q, tl.trans(k), FP32_DOT) * scaling
        if softcap > 0:
            s = soft_cap(s, softcap)
        s = tl.where(p_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        v = tl.load(
            v_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, FP32_DOT)
        m_i = m_new

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    mid = (b.to(tl.int64) * num_heads + heads) * NUM_SPLITS + split
    tl.store(
        mid_o_ptr + mid[:, None] * HEAD_DIM + d[None, :],
        out,
        mask=h_mask[:, None] & d_mask[None, :],
    )
    tl.store(mid_lse_ptr + mid, lse, mask=h_mask)


@triton.jit
def _decode_reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    base = (b.to(tl.int64) * num_heads + h) * NUM_SPLITS
    splits = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + base + splits)
    top = tl.max(lse, 0)
    weights = tl.exp(lse - top)  # empty splits carry -inf: weight 0
    parts = tl.load(
        mid_o_ptr + (base + splits)[:, None] * HEAD_DIM + d[None, :],
        mask=d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(weights[:, None] * parts, 0) / tl.sum(weights, 0)
    tl.store(
        out_ptr + b.to(tl.int64) * stride_ot + h * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scaling: float,
    window: int | None = None,
    mid: tuple[torch.Tensor, torch.Tensor] | None = None,
    softcap: float | None = None,
) -> None:
    """One query token per request attends to its whole (or last `window`) context.

    q, out: [B, H, D]; k_buf, v_buf: [slots, Hkv, D]; req_rows, seq_lens: [B] int32 (the
    sequence length includes the token being decoded, whose K/V is already in the pool).
    mid: preallocated split partials and LSE (`alloc_decode_mid`, for >= B rows), as CUDA graphs
    need (nothing allocated per call); else they are allocated here.
    softcap: scaled scores become softcap * tanh(score / softcap) (Gemma 2), None for none.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    if mid is None:
        mid_o, mid_lse = alloc_decode_mid(batch, num_heads, head_dim, q.device)
    else:
        # NOTE: leading rows of contiguous buffers: the kernels index them densely by row
        mid_o, mid_lse = mid[0][:batch], mid[1][:batch]
        assert mid_o.shape[1:] == (num_heads, NUM_SPLITS, head_dim), "mid buffers of another shape"
    _decode_partial_kernel[(batch, num_kv_heads, NUM_SPLITS)](
        q,
        k_buf,
        v_buf,
        req_to_token,
        req_rows,
        seq_lens,
        mid_o,
        mid_lse,
        q.stride(0),
        q.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        req_to_token.stride(0),
        scaling,
        window or 0,
        softcap or 0.0,
        GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=BLOCK_N,
        NUM_SPLITS=NUM_SPLITS,
        FP32_DOT=exact_dots(q.dtype),
    )
    _decode_reduce_kernel[(batch, num_heads)](
        mid_o,
        mid_lse,
        out,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        NUM_SPLITS=NUM_SPLITS,
    )


def alloc_decode_mid(
    rows: int, num_heads: int, head_dim: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split partials [rows, H, NUM_SPLITS, D] and their LSE [rows, H, NUM_SPLITS] (float32)."""
    mid_o = torch.empty((rows, num_heads, NUM_SPLITS, head_dim), dtype=torch.float32, device=device)
    mid_lse = torch.empty((rows, num_heads, NUM_SPLITS), dtype=torch.float32, device=device)
    return mid_o, mid_lse
