"""Apply packed grammar token bitmasks to logits in one vectorised op per batch (scheduler process).

A bitmask row is int32 [ceil(V/32)]: bit `t % 32` of word `t // 32` is set when token `t` is
allowed (the layout xgrammar, llguidance and outlines-core all write). Unpacking bits with shifts
costs ~135 µs per 49k-vocab row on CPU; reading the little-endian bytes through a 256-entry table
of additive (0 / -inf) rows (an embedding lookup) costs ~20 µs, so that is the fast path here.
"""

from __future__ import annotations

from functools import cache

import torch

from .device_io import upload

_BITS_PER_WORD = 32


@cache
def _byte_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 8]: row b holds 0 where bit i of byte b is set and -inf where it is clear."""
    bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
    table = torch.zeros(256, 8, dtype=dtype)
    table.masked_fill_(bits == 0, float("-inf"))
    return table.to(device)


def bitmask_to_additive(bitmask: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[R, W] int32 packed mask -> [R, vocab] additive mask (0 allowed, -inf banned)."""
    assert bitmask.dtype == torch.int32 and bitmask.dim() == 2
    rows, words = bitmask.shape
    # NOTE: byte k of word w holds tokens 32w + 8k .. 32w + 8k + 7 on little-endian hosts
    as_bytes = bitmask.contiguous().view(torch.uint8).view(rows, words * 4).long()
    table = _byte_table(bitmask.device, dtype)
    additive = torch.nn.functional.embedding(as_bytes, table).view(rows, words * _BITS_PER_WORD)
    if vocab <= additive.shape[1]:
        return additive[:, :vocab]
    # tokens past the mask's width were never allowed by the grammar
    pad = torch.full(
        (rows, vocab - additive.shape[1]), float("-inf"), dtype=dtype, device=additive.device
    )
    return torch.cat([additive, pad], dim=1)


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """In place: logits of tokens whose bit is 0 become -inf.

    logits: float [B, V]; bitmask: int32 [R, ceil(V/32)]; rows: long [R], the logits row of each
    mask row (distinct), or None when R == B and mask row i belongs to logits row i.
    On CUDA one Triton kernel writes -inf where a bit is clear (kernels/triton/bitmask.py).
    NOTE: on CPU the mask is added, so a +inf logit under a banned bit would become NaN; logits
    here are finite model outputs (plus finite biases), and -inf stays -inf.
    """
    if bitmask.shape[0] == 0:
        return
    if logits.is_cuda:  # NOTE: imported here, so that the CPU path never loads triton
        from .triton.bitmask import apply_token_bitmask as apply_on_gpu

        apply_on_gpu(logits, bitmask, rows)
        return
    additive = bitmask_to_additive(bitmask, logits.shape[-1], logits.dtype)
    if rows is None:
        logits.add_(additive)
    else:
        index = upload(rows.to(torch.long), logits.device)
        logits.index_add_(0, index, additive)


def apply_token_bitmask_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Bit-by-bit reference (slow, obviously right): the oracle for tests of the fast path."""
    vocab = logits.shape[-1]
    shifts = torch.arange(_BITS_PER_WORD, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.flatten(start_dim=1)
    if allowed.shape[1] < vocab:
        pad = torch.zeros(allowed.shape[0], vocab - allowed.shape[1], dtype=allowed.dtype)
        allowed = torch.cat([allowed, pad], dim=1)
    banned = allowed[:, :vocab] == 0
    targets = range(bitmask.shape[0]) if rows is None else rows.tolist()
    for mask_row, logit_row in enumerate(targets):
        logits[logit_row].masked_fill_(banned[mask_row], float("-inf"))
