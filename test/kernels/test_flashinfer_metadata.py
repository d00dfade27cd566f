"""The flashinfer backend's per-step index tensors (pure torch, no flashinfer import), against
layouts worked out by hand: page sizes 1 and 16, empty and cached prefixes, mixed batches."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

import pytest
import torch

from radixgen.kernels.attention.flashinfer_metadata import (
    graph_step_layout,
    indptr_of,
    paged_kv,
    rows_on,
    step_layout,
)


def table(rows: dict[int, list[int]], width: int = 40) -> torch.Tensor:
    """A request -> slot table with the given rows filled (others zero: the padding slot)."""
    t = torch.zeros((max(rows) + 2, width), dtype=torch.long)
    for row, slots in rows.items():
        t[row, : len(slots)] = torch.tensor(slots)
    return t


def layout(t: torch.Tensor, rows: list[int], lens: list[int], page_size: int) -> tuple:
    p = paged_kv(t, rows_on(t.device, rows), lens, page_size)
    for x in (p.indptr, p.indices, p.last_page_len):
        assert x.dtype == torch.int32
    return p.indptr.tolist(), p.indices.tolist(), p.last_page_len.tolist()


def test_indptr_of_new_tokens() -> None:
    assert indptr_of([3, 1, 7]).tolist() == [0, 3, 4, 11]
    assert indptr_of([3, 1, 7]).dtype == torch.int32
    assert indptr_of([]).tolist() == [0]


def test_page_size_one_lists_every_slot_in_order() -> None:
    t = table({2: [9, 4, 7, 30], 0: [5, 6], 3: [11]})
    # request slots out of order, one of them read shorter than it is filled
    assert layout(t, [2, 3, 0], [4, 1, 1], 1) == ([0, 4, 5, 6], [9, 4, 7, 30, 11, 5], [1, 1, 1])


def test_page_size_sixteen_lists_page_ids_and_last_page_fill() -> None:
    def pages(*ids: int) -> list[int]:
        return [s for p in ids for s in range(p * 16, p * 16 + 16)]

    t = table({1: pages(5, 2, 9), 4: pages(3), 2: pages(7, 1)}, width=48)
    # 33 tokens: pages 5, 2 full and 1 token of page 9; 16: exactly page 3; 17: page 7 + 1 of 1
    assert layout(t, [1, 4, 2], [33, 16, 17], 16) == ([0, 3, 4, 6], [5, 2, 9, 3, 7, 1], [1, 16, 1])
    # a 1-token sequence reads its first page only
    assert layout(t, [1], [1], 16) == ([0, 1], [5], [1])


def test_requests_without_prefix_get_no_pages() -> None:
    """A mixed step's paged part covers the cached prefixes only: a fresh prompt (prefix 0) is an
    empty row (no pages, last_page_len 0) between requests that have one."""
    t = table({0: [3, 8, 2], 1: [20, 21], 5: [40, 41, 42, 43, 44]})
    assert layout(t, [5, 0, 1], [0, 2, 0], 1) == ([0, 0, 2, 2], [3, 8], [0, 1, 0])
    # page size 16: slots 32..47 are page 2, 48.. page 3
    t = table({0: list(range(32, 50)), 1: list(range(64, 70))})
    assert layout(t, [1, 0], [0, 17], 16) == ([0, 0, 2], [2, 3], [0, 1])
    assert layout(t, [0, 1], [0, 0], 16) == ([0, 0, 0], [], [0, 0])


def test_padded_graph_rows_read_the_padding_page() -> None:
    """CUDA-graph padding rows (request slot 0, seq len 1) land on page 0, the padding page."""
    t = table({0: [], 3: [16, 17, 18]}, width=8)
    assert layout(t, [3, 0, 0], [3, 1, 1], 16) == ([0, 1, 2, 3], [1, 0, 0], [3, 1, 1])
    # the rows may come as an int32 device buffer (the graph runner's static req_rows)
    p = paged_kv(t, torch.tensor([3, 0], dtype=torch.int32), [2, 1], 1)
    assert p.indices.tolist() == [16, 17, 0]


def test_empty_batch() -> None:
    t = table({0: [1]})
    assert layout(t, [], [], 1) == ([0], [], [])


def test_a_long_request_matches_a_direct_gather() -> None:
    """2,000 tokens in shuffled pages: the page table re-expands to exactly the request's slots."""
    gen = torch.Generator().manual_seed(0)
    for page_size in (1, 16):
        n_pages = -(-2000 // page_size)
        pages = torch.randperm(n_pages + 10, generator=gen)[:n_pages] + 1
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:2000]
        t = torch.zeros((3, 2048), dtype=torch.long)
        t[1, :2000] = slots
        t[2, :500] = slots[:500].flip(0) if page_size == 1 else slots[:500]
        p = paged_kv(t, rows_on(t.device, [1, 2]), [2000, 500], page_size)
        ids = p.indices.long()
        start, mid, end = p.indptr.tolist()
        expanded = (ids[start:mid, None] * page_size + torch.arange(page_size)).flatten()
        assert torch.equal(expanded[:2000], slots)
        assert p.last_page_len.tolist()[0] == 2000 - (mid - 1) * page_size
        expanded = (ids[mid:end, None] * page_size + torch.arange(page_size)).flatten()
        assert torch.equal(expanded[:500], t[2, :500])


@dataclass
class Batch:
    out_cache_loc: torch.Tensor
    req_pool_indices_cpu: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_start_loc: list[int]


def batch(rows: list[int], prefixes: list[int], extends: list[int]) -> Batch:
    starts = [sum(extends[:i]) for i in range(len(extends))]
    return Batch(torch.zeros(sum(extends), dtype=torch.long), rows, prefixes, extends, starts)


def test_a_decode_step_pages_each_whole_sequence() -> None:
    t = table({1: [4, 5, 6], 2: [9, 8]})
    step = step_layout(batch([2, 1], [1, 2], [1, 1]), t, 1)
    assert step.kind == "decode" and step.qo_indptr is None
    assert step.paged is not None
    # the new token's slot (already allocated) is part of the paged sequence
    assert step.paged.indptr.tolist() == [0, 2, 5]
    assert step.paged.indices.tolist() == [9, 8, 4, 5, 6]


def test_a_mixed_step_is_ragged_new_tokens_plus_paged_prefixes() -> None:
    # a decode row (prefix 2), a fresh prompt of 3 and a 2-token chunk on a 1-token prefix
    t = table({1: [4, 5, 6], 2: [9, 8, 7], 3: [11, 12, 13]})
    step = step_layout(batch([1, 2, 3], [2, 0, 1], [1, 3, 2]), t, 1)
    assert step.kind == "extend" and step.has_prefix
    assert step.qo_indptr is not None and step.qo_indptr.tolist() == [0, 1, 4, 6]
    assert step.qo_indptr.dtype == torch.int32
    assert step.paged is not None
    assert step.paged.indptr.tolist() == [0, 2, 2, 3]  # prefixes only: the new tokens are ragged
    assert step.paged.indices.tolist() == [4, 5, 11]
    assert step.paged.last_page_len.tolist() == [1, 0, 1]


def test_fresh_prompts_need_no_paged_part() -> None:
    t = table({0: [1, 2], 4: [3, 4, 5]})
    step = step_layout(batch([4, 0], [0, 0], [3, 2]), t, 16)
    assert step.kind == "extend" and not step.has_prefix
    assert step.paged is not None and step.paged.indices.numel() == 0


def test_an_empty_step_is_idle() -> None:
    assert step_layout(batch([], [], []), table({0: []}), 1).kind == "idle"


def test_a_graph_step_takes_the_runners_static_rows() -> None:
    t = table({0: [], 2: list(range(32, 50))}, width=24)
    rows = torch.tensor([2, 0, 0, 0], dtype=torch.int32)  # one request, three padding rows
    step = graph_step_layout(4, rows, [18, 1, 1, 1], t, 16)
    assert step.kind == "graph" and step.graph_bs == 4
    assert step.paged is not None
    assert step.paged.indptr.tolist() == [0, 2, 3, 4, 5]
    assert step.paged.indices.tolist() == [2, 3, 0, 0, 0]
    assert step.paged.last_page_len.tolist() == [2, 1, 1, 1]


def test_metadata_module_imports_no_flashinfer() -> None:
    assert "flashinfer" not in sys.modules


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="it is installed")
def test_the_backend_without_flashinfer_says_what_it_needs() -> None:
    from radixgen.kernels.attention import create_attention_backend

    class Pool:
        device_req_to_token = req_to_token = torch.zeros((2, 4), dtype=torch.long)
        dtype = torch.bfloat16  # a KV pool in the model dtype (a converted one is refused first)

        def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
            buf = torch.zeros((4, 1, 64), dtype=self.dtype)
            return buf, buf

    with pytest.raises(ImportError, match=r"needs flashinfer-python 0\.6\.13"):
        create_attention_backend("flashinfer", Pool(), Pool())  # type: ignore[arg-type]
    assert "flashinfer" not in sys.modules
