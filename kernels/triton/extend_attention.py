"""Paged extend (prefill) attention: new tokens attend to the cached prefix and causally to each
other, in one kernel with an online softmax.

The new tokens' K/V are written into the pool before the call, so a request's keys are one run
of positions 0 .. prefix + extend - 1, read through `req_to_token`; the causal mask is aligned to
the bottom right (query i of a request sits at position prefix + i). Decode rows (extend 1) may
ride in the same call, so a mixed batch is one launch per layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import dot, exact_dots, soft_cap

BLOCK_M = 32
BLOCK_N = 32


@triton.jit
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    req_to_token_ptr,
    req_rows_ptr,
    prefix_lens_ptr,
    extend_lens_ptr,
    extend_starts_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_r2t,
    scaling,
    window,
    softcap,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    extend_len = tl.load(extend_lens_ptr + b)
    if m_block * BLOCK_M < extend_len:
        prefix = tl.load(prefix_lens_ptr + b)
        first_token = tl.load(extend_starts_ptr + b).to(tl.int64)
        row = tl.load(req_rows_ptr + b).to(tl.int64)
        kv_head = head // GROUP

        q_idx = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        q_mask = q_idx < extend_len
        q_pos = prefix + q_idx
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        q = tl.load(
            q_ptr + (first_token + q_idx)[:, None] * stride_qt + head * stride_qh + d[None, :],
            mask=q_mask[:, None] & d_mask[None, :],
            other=0.0,
        )

        # keys past this block's last query are masked for every row: stop there
        kv_end = prefix + tl.minimum((m_block + 1) * BLOCK_M, extend_len)
        kv_start = 0
        if window > 0:
            kv_start = tl.maximum(prefix + m_block * BLOCK_M - window + 1, 0)
            kv_start = (kv_start // BLOCK_N) * BLOCK_N

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for n0 in range(kv_start, kv_end, BLOCK_N):
            k_pos = n0 + tl.arange(0, BLOCK_N)
            k_mask = k_pos < kv_end
            slots = tl.load(req_to_token_ptr + row * stride_r2t + k_pos, mask=k_mask, other=0).to(
                tl.int64
            )
            kv_mask = k_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            s = dot(q, tl.trans(k), FP32_DOT) * scaling
            if softcap > 0:
                s = soft_cap(s, softcap)
            visible = k_mask[None, :] & (k_pos[None, :] <= q_pos[:, None])
            if window > 0:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
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

        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + (first_token + q_idx)[:, None] * stride_ot + head * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=q_mask[:, None] & d_mask[None, :],
        )


def extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_starts: torch.Tensor,
    max_extend_len: int,
    scaling: float,
    window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Request b's `extend_lens[b]` new tokens (flat rows from `extend_starts[b]`) attend to its
    `prefix_lens[b]` cached tokens and causally to each other.

    q, out: [N, H, D]; k_buf, v_buf: [slots, Hkv, D]; per-request tensors [B] int32;
    `max_extend_len` (host int) sizes the grid.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    batch = req_rows.shape[0]
    if batch == 0 or max_extend_len == 0:
        return
    _extend_kernel[(batch, num_heads, triton.cdiv(max_extend_len, BLOCK_M))](
        q,
        k_buf,
        v_buf,
        out,
        req_to_token,
        req_rows,
        prefix_lens,
        extend_lens,
        extend_starts,
        q.stride(0),
        q.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        scaling,
        window or 0,
        softcap or 0.0,
        GROUP=num_heads // k_buf.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        FP32_DOT=exact_dots(q.dtype),
    )
