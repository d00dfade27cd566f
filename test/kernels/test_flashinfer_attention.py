"""The flashinfer attention backend against the float32 reference and the torch backend, on random
ragged batches over a shuffled paged pool (GPU only: skipped without CUDA or flashinfer).

Shapes of the default model: GQA 9/3, head dim 64, bf16; page sizes 1 and 16; cached prefixes
{0, 1, 17, 500, 2000} x new tokens {1, 7, 128}, extend and decode rows in one batch; decode-only
steps; and one decode step captured in a CUDA graph, replayed with other requests and lengths.
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass

import pytest
import torch
from triton_cases import RaggedBatch, ragged_batch, reference

from radixgen.kernels.attention import AttentionLayerInfo, create_attention_backend
from radixgen.kernels.attention.torch_backend import TorchAttentionBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None, reason="flashinfer is not installed"
    ),
]

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
LAYER = AttentionLayerInfo(0, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)
TOL = 3e-2  # bf16 inputs and output, float32 reference
PREFIXES = [0, 1, 17, 500, 2000]
EXTENDS = [1, 7, 128]


@dataclass
class Pool:
    """The pool and request table a backend reads: `layers` copies of one batch's K/V buffers."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    page_size: int
    device_req_to_token: torch.Tensor

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.device_req_to_token

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer_id], self.v[layer_id]

    def set_kv(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer_id][slots] = k
        self.v[layer_id][slots] = v


@dataclass
class Batch:
    out_cache_loc: torch.Tensor
    req_pool_indices_cpu: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_start_loc: list[int]


def pool_of(b: RaggedBatch, page_size: int, device: str, layers: int = 1) -> Pool:
    k = [b.k_buf.to(device) if i == 0 else b.k_buf.roll(1, 0).to(device) for i in range(layers)]
    v = [b.v_buf.to(device) if i == 0 else b.v_buf.roll(1, 0).to(device) for i in range(layers)]
    return Pool(k, v, page_size, b.req_to_token.to(device))


def batch_of(b: RaggedBatch, device: str) -> Batch:
    r2t = b.req_to_token.cpu()
    new_slots = [
        r2t[row, p : p + e] for row, p, e in zip(b.rows, b.prefix_lens, b.extend_lens, strict=True)
    ]
    return Batch(torch.cat(new_slots).to(device), b.rows, b.prefix_lens, b.extend_lens, b.starts)


def as_batch(b: RaggedBatch, pool: Pool, layer: int) -> RaggedBatch:
    """`b` over one layer's buffers of `pool` (for the reference)."""
    return RaggedBatch(
        b.q,
        pool.k[layer],
        pool.v[layer],
        b.req_to_token,
        b.rows,
        b.prefix_lens,
        b.extend_lens,
        b.starts,
    )


def run_step(
    b: RaggedBatch, page_size: int, layers: int, pass_kv: bool
) -> tuple[list[torch.Tensor], Pool]:
    """flashinfer over `layers` layers of one step; the new tokens' K/V are random values the
    backend writes (pass_kv) or the caller wrote before (the fused rotary + store path)."""
    pool = pool_of(b, page_size, "cuda", layers)
    batch = batch_of(b, "cuda")
    backend = create_attention_backend("flashinfer", pool, pool)
    backend.init_forward_metadata(batch)
    gen = torch.Generator().manual_seed(7)
    n = b.q.shape[0]
    outs = []
    for layer_id in range(layers):
        layer = AttentionLayerInfo(layer_id, HEADS, KV_HEADS, HEAD_DIM, LAYER.scaling)
        k, v = (torch.randn(n, KV_HEADS * HEAD_DIM, generator=gen) for _ in range(2))
        k, v = k.to("cuda", torch.bfloat16), v.to("cuda", torch.bfloat16)
        q = b.q.to("cuda").view(n, HEADS * HEAD_DIM)
        if pass_kv:
            out = backend.forward(q, k, v, layer, batch)
        else:
            pool.set_kv(
                layer_id,
                batch.out_cache_loc,
                k.view(n, KV_HEADS, HEAD_DIM),
                v.view(n, KV_HEADS, HEAD_DIM),
            )
            out = backend.forward(q, None, None, layer, batch)
        outs.append(out.view(n, HEADS, HEAD_DIM))
    torch.cuda.synchronize()
    return outs, pool


def mixed_batch(page_size: int, seed: int) -> RaggedBatch:
    combos = list(itertools.product(PREFIXES, EXTENDS))
    order = torch.randperm(len(combos), generator=torch.Generator().manual_seed(seed)).tolist()
    prefixes = [combos[i][0] for i in order]
    extends = [combos[i][1] for i in order]
    return ragged_batch(
        prefixes,
        extends,
        heads=HEADS,
        kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        page_size=page_size,
        dtype=torch.bfloat16,
        seed=seed,
    )


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("pass_kv", [True, False])
def test_mixed_extend_and_decode_match_the_reference(page_size: int, pass_kv: bool) -> None:
    b = mixed_batch(page_size, seed=page_size)
    outs, pool = run_step(b, page_size, layers=2, pass_kv=pass_kv)
    for layer_id, out in enumerate(outs):  # the second layer reuses the step's plan
        assert torch.isfinite(out).all()
        ref = reference(as_batch(b, pool, layer_id), LAYER.scaling, None)
        torch.testing.assert_close(out.float().cpu(), ref, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("page_size", [1, 16])
def test_fresh_prompts_only_take_the_ragged_path(page_size: int) -> None:
    b = ragged_batch(
        [0, 0, 0],
        [7, 128, 1],
        heads=HEADS,
        kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        page_size=page_size,
        dtype=torch.bfloat16,
        seed=3,
    )
    (out,), pool = run_step(b, page_size, layers=1, pass_kv=True)
    ref = reference(as_batch(b, pool, 0), LAYER.scaling, None)
    torch.testing.assert_close(out.float().cpu(), ref, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_only_step_matches_the_reference_and_the_torch_backend(page_size: int) -> None:
    prefixes = [*PREFIXES, 2047, 15, 16]
    b = ragged_batch(
        prefixes,
        [1] * len(prefixes),
        heads=HEADS,
        kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        page_size=page_size,
        dtype=torch.bfloat16,
        seed=11,
    )
    cpu_pool = pool_of(b, page_size, "cpu")  # before the step writes the new tokens' K/V
    (out,), pool = run_step(b, page_size, layers=1, pass_kv=True)
    ref = reference(as_batch(b, pool, 0), LAYER.scaling, None)
    torch.testing.assert_close(out.float().cpu(), ref, atol=TOL, rtol=TOL)

    torch_backend = TorchAttentionBackend(cpu_pool, cpu_pool, native=None)
    batch = batch_of(b, "cpu")
    torch_backend.init_forward_metadata(batch)
    n = b.q.shape[0]
    k, v = pool.k[0][batch.out_cache_loc.cuda()].cpu(), pool.v[0][batch.out_cache_loc.cuda()].cpu()
    want = torch_backend.forward(
        b.q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1), LAYER, batch
    )
    torch.testing.assert_close(out.cpu().reshape(n, -1).float(), want.float(), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_in_a_cuda_graph_replays_with_new_lengths(page_size: int) -> None:
    """Capture one decode call for 4 rows (3 requests + a padding row), then replay it for other
    requests with other lengths; each replay is planned outside the graph."""
    prefixes = [3, 500, 2000, 17, 1, 1200, 64]
    b = ragged_batch(
        prefixes,
        [1] * len(prefixes),
        heads=HEADS,
        kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        page_size=page_size,
        dtype=torch.bfloat16,
        seed=5,
    )
    pool = pool_of(b, page_size, "cuda")
    ref = reference(as_batch(b, pool, 0), LAYER.scaling, None)
    backend = create_attention_backend("flashinfer", pool, pool, layer_info=LAYER)
    assert backend.supports_cuda_graph
    bs = 4
    backend.init_cuda_graph_state(max_bs=8, max_context_len=2100)
    req_rows = torch.zeros(bs, dtype=torch.int32, device="cuda")
    seq_lens = torch.ones(bs, dtype=torch.int32, device="cuda")
    q = torch.zeros(bs, HEADS * HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    static = Batch(torch.zeros(bs, dtype=torch.long, device="cuda"), [], [], [], [])

    def fill(picks: list[int]) -> None:
        rows = [b.rows[i] for i in picks] + [0] * (bs - len(picks))
        lens = [b.prefix_lens[i] + 1 for i in picks] + [1] * (bs - len(picks))
        req_rows.copy_(torch.tensor(rows, dtype=torch.int32))
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.zero_()
        q[: len(picks)] = b.q[picks].reshape(len(picks), -1).cuda()
        backend.init_forward_metadata_graph(bs, req_rows, seq_lens, lens)

    fill([0, 1, 2])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            backend.forward(q, None, None, LAYER, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, None, None, LAYER, static)
    for picks in ([0, 1, 2], [3, 4, 5, 6], [6, 2]):
        fill(picks)
        graph.replay()
        torch.cuda.synchronize()
        got = out[: len(picks)].view(len(picks), HEADS, HEAD_DIM).float().cpu()
        torch.testing.assert_close(got, ref[picks], atol=TOL, rtol=TOL)
