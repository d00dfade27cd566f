"""Grammar token-bitmask apply on the GPU: banned logits become -inf in place, in one launch.

The mask layout is kernels/grammar_mask.py's (int32 [R, ceil(V/32)], bit `t % 32` of word
`t // 32` allows token t; tokens past the mask's width are banned). Each program reads one block
of a mask row's words and writes -inf only where a bit is clear, so allowed logits are never
rewritten.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device_io import upload

BLOCK = 1024  # tokens per program (32 mask words)


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab,
    words,
    stride_logits,
    stride_mask,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    row = r
    if HAS_ROWS:
        row = tl.load(rows_ptr + r).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    word = tokens // 32
    bits = tl.load(bitmask_ptr + r * stride_mask + word, mask=word < words, other=0)
    banned = ((bits >> (tokens % 32)) & 1) == 0
    neg_inf = tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_logits + tokens, neg_inf, mask=banned & (tokens < vocab))


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """In place: logits of tokens whose bit is 0 become -inf.

    logits: float [B, V] (unit column stride); bitmask: int32 [R, W] packed masks; rows: long or
    int [R], the logits row of each mask row, or None when R == B (row i for row i).
    """
    assert logits.dim() == 2 and logits.stride(1) == 1
    assert bitmask.dtype == torch.int32 and bitmask.dim() == 2 and bitmask.stride(1) == 1
    num_rows, words = bitmask.shape
    vocab = logits.shape[1]
    if rows is None:
        assert num_rows == logits.shape[0]
    else:
        assert rows.shape == (num_rows,)
        rows = upload(rows, logits.device)
    if num_rows == 0 or vocab == 0:
        return
    bitmask = upload(bitmask.contiguous(), logits.device)
    _apply_bitmask_kernel[(num_rows, triton.cdiv(vocab, BLOCK))](
        logits,
        bitmask,
        bitmask if rows is None else rows,  # never read without HAS_ROWS
        vocab,
        words,
        logits.stride(0),
        bitmask.stride(0),
        HAS_ROWS=rows is not None,
        BLOCK=BLOCK,
        num_warps=4,
    )
