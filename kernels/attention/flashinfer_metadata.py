"""The per-step index tensors flashinfer's wrappers are planned with, built from the host lists of
a batch and the request -> slot table (pure torch, any device: tested on CPU).

flashinfer reads the KV pool as pages: each per-layer buffer [slots, Hkv, D] viewed as
[pages, page_size, Hkv, D] (NHD), where slot = page * page_size + offset. A request's KV is a
CSR row of page ids (`indptr`, `indices`) plus how many entries its last page holds.

NOTE: the pool's allocator fills a request's pages in position order (position j sits at offset
j % page_size of its page), so the page of positions [j*P, (j+1)*P) is req_to_token[row, j*P] // P.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..device_io import upload

if TYPE_CHECKING:
    from .base import AttentionBatch


@dataclass(frozen=True)
class PagedKV:
    """One CSR page table over a batch's requests, in the form flashinfer's `plan()` takes."""

    indptr: torch.Tensor  # [B + 1] int32, host: each request's first entry in `indices`
    indices: torch.Tensor  # [indptr[-1]] int32 page ids, on req_to_token's device
    last_page_len: torch.Tensor  # [B] int32, host: entries in the last page (0: no pages)


def indptr_of(lens: list[int]) -> torch.Tensor:
    """[0, l0, l0 + l1, ...] as a host int32 tensor (flashinfer's qo_indptr / ragged kv_indptr)."""
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    if lens:
        torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0, out=out[1:])
    return out


def paged_kv(
    req_to_token: torch.Tensor, rows: torch.Tensor, kv_lens: list[int], page_size: int
) -> PagedKV:
    """The page table of the first `kv_lens[i]` positions of request slot `rows[i]`.

    rows: [B] request slots on req_to_token's device (a graph runner's static buffer, or the
    step's host list moved there). A request with no KV gets no pages and last_page_len 0, which
    flashinfer's kernels read as an empty sequence. The host does O(B) work; the gather of page
    ids runs where the table lives, with no host synchronisation.
    """
    lens = torch.tensor(kv_lens, dtype=torch.int64)
    pages = (lens + page_size - 1) // page_size
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int64)
    torch.cumsum(pages, 0, out=indptr[1:])
    last_page_len = torch.where(pages > 0, lens - (pages - 1) * page_size, 0)
    total = int(indptr[-1])
    device = req_to_token.device
    # one copy up: each request's page count and first entry
    counts, starts = upload(torch.stack([pages, indptr[:-1]]), device)
    owner = torch.repeat_interleave(
        torch.arange(len(kv_lens), device=device), counts, output_size=total
    )
    page_no = torch.arange(total, device=device) - starts[owner]
    slots = req_to_token[rows.long()[owner], page_no * page_size]
    return PagedKV(
        indptr=indptr.to(torch.int32),
        indices=(slots // page_size).to(torch.int32),
        last_page_len=last_page_len.to(torch.int32),
    )


def rows_on(device: torch.device, rows: list[int]) -> torch.Tensor:
    """A step's host list of request slots, on the table's device."""
    return upload(torch.tensor(rows, dtype=torch.int64), device)


@dataclass
class StepLayout:
    """What one step's layers run, and over which index tensors.

    decode (every row has one new token): paged attention over each whole sequence, new token
    included. extend (any row has more): ragged causal attention over the new tokens (`qo_indptr`
    for both queries and keys) plus, when some row has a cached prefix, paged attention over the
    prefixes only; decode rows ride along as 1-token extends. graph: a decode step of a captured
    batch size. idle: no rows.
    """

    kind: str  # "idle" | "decode" | "extend" | "graph"
    paged: PagedKV | None = None
    qo_indptr: torch.Tensor | None = None  # extend: host int32 offsets of the new tokens
    has_prefix: bool = False
    graph_bs: int = 0
    planned: tuple[int, float] | None = None  # (query heads, scale) the wrappers were planned for


def step_layout(batch: AttentionBatch, req_to_token: torch.Tensor, page_size: int) -> StepLayout:
    rows, prefix_lens, extend_lens = (
        batch.req_pool_indices_cpu,
        batch.prefix_lens,
        batch.extend_lens,
    )
    if not rows:
        return StepLayout("idle")
    rows_dev = rows_on(req_to_token.device, rows)
    if all(e == 1 for e in extend_lens):
        seq_lens = [p + 1 for p in prefix_lens]
        return StepLayout("decode", paged=paged_kv(req_to_token, rows_dev, seq_lens, page_size))
    return StepLayout(
        "extend",
        paged=paged_kv(req_to_token, rows_dev, prefix_lens, page_size),
        qo_indptr=indptr_of(extend_lens),
        has_prefix=any(p > 0 for p in prefix_lens),
    )


def graph_step_layout(
    bs: int,
    req_rows: torch.Tensor,
    seq_lens_host: list[int],
    req_to_token: torch.Tensor,
    page_size: int,
) -> StepLayout:
    """A captured decode step: the graph runner's static request rows and the host lengths."""
    assert len(seq_lens_host) == bs, (len(seq_lens_host), bs)
    return StepLayout(
        "graph", paged=paged_kv(req_to_token, req_rows, seq_lens_host, page_size), graph_bs=bs
    )
