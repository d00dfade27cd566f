"""The Triton backend's CUDA-graph hooks: a decode step set up through
`init_forward_metadata_graph` over the graph runner's padded static buffers gives the real rows
exactly what the eager metadata gives, across changing lengths, with the partials' buffers
allocated once; padding rows write only the padding page.

`gpu` + `triton_interpret`: natively on CUDA, interpreted on CPU (scripts/test_triton_cpu.sh).
No graph is captured here (test/models/test_cuda_graphs.py does that on the GPU).
"""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.attention.base import AttentionLayerInfo
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.model_executor.cuda_graph_runner import (
    StaticDecodeInputs,
    decode_batch_of,
    fill_static_inputs,
)
from radixgen.runtime.model_executor.forward_batch import ForwardBatch

pytestmark = [pytest.mark.gpu, pytest.mark.triton_interpret]

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # the default model's GQA 3:1
LAYER = AttentionLayerInfo(0, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)


def _setup(seq_lens: list[int], seed: int):
    from radixgen.kernels.attention.triton_backend import TritonAttentionBackend

    gen = torch.Generator().manual_seed(seed)
    kv = TokenToKVPool(512, 1, 1, KV_HEADS, HEAD_DIM, torch.float32, DEVICE)
    k_buf, v_buf = kv.get_kv_buffer(0)
    k_buf[1:].copy_(torch.randn(k_buf[1:].shape, generator=gen))
    v_buf[1:].copy_(torch.randn(v_buf[1:].shape, generator=gen))
    pool = ReqToTokenPool(8, 128, DEVICE)
    rows = [3, 1, 6][: len(seq_lens)]
    slots = torch.randperm(511, generator=gen)[: sum(seq_lens)] + 1
    used = 0
    for row, n in zip(rows, seq_lens, strict=True):
        pool.write_row(row, 0, slots[used : used + n])
        used += n
    backend = TritonAttentionBackend(kv, pool)
    return backend, kv, pool, rows


def _last_slots(pool, rows: list[int], seq_lens: list[int]) -> torch.Tensor:
    """The KV slot of each row's newest token (already in the pool)."""
    return torch.tensor(
        [int(pool.req_to_token[r, n - 1]) for r, n in zip(rows, seq_lens, strict=True)]
    )


def _eager(backend, pool, rows, seq_lens, q) -> torch.Tensor:
    last = _last_slots(pool, rows, seq_lens)
    batch = ForwardBatch(
        q.new_zeros(len(rows), dtype=torch.long), q.new_zeros(len(rows), dtype=torch.long),
        last.to(DEVICE), rows, [n - 1 for n in seq_lens], [1] * len(rows),
        list(range(len(rows))), None,
    )  # fmt: skip
    backend.init_forward_metadata(batch)
    return backend.forward(q.reshape(len(rows), -1), None, None, LAYER, batch)


def test_graph_metadata_decodes_the_real_rows_like_eager():
    gen = torch.Generator().manual_seed(7)
    backend, _, pool, rows = _setup([40, 3, 77], seed=1)
    static = StaticDecodeInputs.allocate(8, DEVICE)
    backend.init_cuda_graph_state(8, 128)
    mid_ptr = None
    for lens in ([40, 3, 77], [5, 1, 70], [33, 2, 64]):  # lengths change between replays
        n, bs = len(rows), 4
        q = torch.randn((bs, HEADS, HEAD_DIM), generator=gen).to(DEVICE)
        want = _eager(backend, pool, rows, lens, q[:n])
        last = _last_slots(pool, rows, lens)
        ids = torch.zeros(n, dtype=torch.long)
        host_lens = fill_static_inputs(static, bs, ids, ids, last, rows, lens)
        backend.init_forward_metadata_graph(
            bs, static.req_rows[:bs], static.seq_lens[:bs], host_lens
        )
        got = backend.forward(q.reshape(bs, -1), None, None, LAYER, decode_batch_of(static, bs))
        torch.testing.assert_close(got[:n], want, atol=0, rtol=0)  # the same kernel and splits
        assert torch.isfinite(got[n:]).all()  # the padding row attends to one key
        mid = backend._graph_mid[(HEADS, HEAD_DIM)]
        assert mid[0].shape[0] == 8  # sized for the largest bucket, whatever bs is
        assert mid_ptr in (None, mid[0].data_ptr())  # allocated once, reused by every step
        mid_ptr = mid[0].data_ptr()


def test_padding_rows_write_only_the_padding_page():
    backend, kv, _, rows = _setup([10, 4], seed=2)
    static = StaticDecodeInputs.allocate(4, DEVICE)
    backend.init_cuda_graph_state(4, 128)
    before = kv.get_kv_buffer(0)[0].clone()
    new_slots = torch.tensor([500, 501])
    ids = torch.zeros(2, dtype=torch.long)
    lens = fill_static_inputs(static, 4, ids, ids, new_slots, rows, [11, 5])
    backend.init_forward_metadata_graph(4, static.req_rows[:4], static.seq_lens[:4], lens)
    q = torch.randn(4, HEADS * HEAD_DIM, device=DEVICE)
    k = torch.randn(4, KV_HEADS * HEAD_DIM, device=DEVICE)
    v = torch.randn(4, KV_HEADS * HEAD_DIM, device=DEVICE)
    backend.forward(q, k, v, LAYER, decode_batch_of(static, 4))
    after = kv.get_kv_buffer(0)[0]
    changed = (after != before).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert set(changed) <= {0, 500, 501} and {500, 501} <= set(changed)
    torch.testing.assert_close(after[500:502], k[:2].view(2, KV_HEADS, HEAD_DIM))


def test_decode_captured_in_a_cuda_graph_follows_its_static_inputs():
    """Captured once at bucket 8; replayed with other rows, lengths and padding: each replay
    equals an eager decode of the real rows."""
    if not torch.cuda.is_available():
        pytest.skip("captures a CUDA graph")
    backend, _, pool, _ = _setup([100, 60, 90], seed=3)
    static = StaticDecodeInputs.allocate(8, DEVICE)
    backend.init_cuda_graph_state(8, 128)
    q = torch.zeros((8, HEADS * HEAD_DIM), device=DEVICE)
    ids = torch.zeros(8, dtype=torch.long)
    lens = fill_static_inputs(static, 8, ids, ids, ids + 1, [0] * 8, [1] * 8)
    backend.init_forward_metadata_graph(8, static.req_rows, static.seq_lens, lens)
    batch = decode_batch_of(static, 8)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            backend.forward(q, None, None, LAYER, batch)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = backend.forward(q, None, None, LAYER, batch)
    gen = torch.Generator().manual_seed(4)
    for rows, seq_lens in (([3, 1, 6], [100, 60, 90]), ([6], [7]), ([1, 3], [33, 64])):
        n = len(rows)
        q.copy_(torch.randn(q.shape, generator=gen))
        last = _last_slots(pool, rows, seq_lens)
        host = fill_static_inputs(static, 8, ids[:n], ids[:n], last, rows, seq_lens)
        backend.init_forward_metadata_graph(8, static.req_rows, static.seq_lens, host)
        graph.replay()
        want = _eager(backend, pool, rows, seq_lens, q[:n].view(n, HEADS, HEAD_DIM))
        torch.testing.assert_close(out[:n], want, atol=1e-5, rtol=0)
