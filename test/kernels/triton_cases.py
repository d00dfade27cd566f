"""Random ragged batches over a paged KV pool, and a float32 reference, for the Triton kernel
tests (on a GPU, and on CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RaggedBatch:
    q: torch.Tensor  # [N, H, D] new tokens' queries, request by request
    k_buf: torch.Tensor  # [slots, Hkv, D]
    v_buf: torch.Tensor
    req_to_token: torch.Tensor  # [rows, max context] long
    rows: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    starts: list[int]

    def ints(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.q.device)


def ragged_batch(
    prefix_lens: list[int],
    extend_lens: list[int],
    *,
    heads: int = 9,
    kv_heads: int = 3,
    head_dim: int = 64,
    page_size: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> RaggedBatch:
    """Requests in shuffled request rows whose positions sit in shuffled KV pages (slot 0, the
    padding page, is never used), as the radix cache and the page allocator leave them."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_req) + 3
    pages = (torch.randperm(num_pages - 1, generator=gen) + 1)[: sum(pages_per_req)]
    rows = torch.randperm(len(seq_lens) + 2, generator=gen)[: len(seq_lens)].tolist()
    req_to_token = torch.zeros((len(seq_lens) + 2, max(seq_lens) + 5), dtype=torch.long)
    used = 0
    for row, n, p in zip(rows, seq_lens, pages_per_req, strict=True):
        mine = pages[used : used + p]
        used += p
        slots = (mine[:, None] * page_size + torch.arange(page_size)[None, :]).flatten()
        req_to_token[row, :n] = slots[:n]
    total_slots = num_pages * page_size

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(dtype)

    starts = [sum(extend_lens[:i]) for i in range(len(extend_lens))]
    return RaggedBatch(
        q=rand(sum(extend_lens), heads, head_dim).to(device),
        k_buf=rand(total_slots, kv_heads, head_dim).to(device),
        v_buf=rand(total_slots, kv_heads, head_dim).to(device),
        req_to_token=req_to_token.to(device),
        rows=rows,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        starts=starts,
    )


def reference(
    batch: RaggedBatch, scaling: float, window: int | None, softcap: float | None = None
) -> torch.Tensor:
    """Float32 attention of every new token over its request's visible keys: [N, H, D]; with
    `softcap`, scaled scores become softcap * tanh(score / softcap) (Gemma 2)."""
    q = batch.q.float().cpu()
    heads, kv_heads = q.shape[1], batch.k_buf.shape[1]
    out = torch.zeros_like(q)
    r2t = batch.req_to_token.cpu()
    for row, prefix, ext, start in zip(
        batch.rows, batch.prefix_lens, batch.extend_lens, batch.starts, strict=True
    ):
        n = prefix + ext
        slots = r2t[row, :n]
        keys = batch.k_buf[slots].float().cpu().repeat_interleave(heads // kv_heads, dim=1)
        values = batch.v_buf[slots].float().cpu().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("ehd,khd->hek", q[start : start + ext], keys) * scaling
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(prefix, n)[:, None]
        k_pos = torch.arange(n)[None, :]
        visible = k_pos <= q_pos
        if window is not None:
            visible &= k_pos > q_pos - window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[start : start + ext] = torch.einsum("hek,khd->ehd", scores.softmax(-1), values)
    return out
