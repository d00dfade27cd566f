"""Attention over the paged KV pool with RadixGen's own Triton kernels (the GPU path).

`init_forward_metadata` moves the step's per-request layout to the device in one copy; every
layer then launches one kernel (decode-only steps: the split-KV decode kernel and its reduction;
any step with a prefill chunk: the extend kernel, decode rows riding along as 1-token extends).
The kernels read KV slots straight from `req_to_token`, so no per-step index list is gathered.

CUDA graphs (decode only): the graph runner's static request rows and sequence lengths become
the metadata as they are, and the decode kernel writes its split partials into buffers
allocated once for the largest captured batch, so a replay reads no host value and allocates
nothing the graph depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device_io import upload
from .base import AttentionBackend, AttentionBatch, AttentionLayerInfo, KVPool, ReqToTokenPool


@dataclass
class TritonAttentionMetadata:
    req_rows: torch.Tensor  # [B] int32 request slots
    seq_lens: torch.Tensor  # [B] int32 prefix + new
    decode_only: bool
    # extend steps only (None in a CUDA-graph decode step)
    prefix_lens: torch.Tensor | None = None  # [B] int32 tokens already in the pool
    extend_lens: torch.Tensor | None = None  # [B] int32 new tokens
    extend_starts: torch.Tensor | None = None  # [B] int32 flat offset of the first new token
    max_extend_len: int = 1
    in_graph: bool = False  # decode partials go to the preallocated buffers


class TritonAttentionBackend(AttentionBackend):
    """Needs CUDA, or Triton's interpreter (TRITON_INTERPRET=1) for tests on CPU tensors."""

    supports_cuda_graph = True

    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool) -> None:
        # NOTE: imported here so that choosing another backend never imports triton
        from radixgen.kernels.triton.decode_attention import alloc_decode_mid, decode_attention
        from radixgen.kernels.triton.extend_attention import extend_attention

        self._decode = decode_attention
        self._extend = extend_attention
        self._alloc_mid = alloc_decode_mid
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.device_req_to_token
        self.meta: TritonAttentionMetadata | None = None
        self.graph_max_bs = 0
        # (heads, head dim) -> decode partials for graph_max_bs rows, shared by every layer
        self._graph_mid: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        # NOTE: the partials' shape needs the layers' head count, known at the first layer's
        # call: that is a warm-up step, run before any capture (`_graph_mid_for` checks it)
        self.graph_max_bs = max_bs
        self._graph_mid.clear()

    def init_forward_metadata_graph(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor, seq_lens_host: list[int]
    ) -> None:
        assert 0 < bs <= self.graph_max_bs, "init_cuda_graph_state sizes the graph buffers"
        self.meta = TritonAttentionMetadata(req_rows, seq_lens, decode_only=True, in_graph=True)

    def _graph_mid_for(self, num_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (num_heads, head_dim)
        mid = self._graph_mid.get(key)
        if mid is None:
            device = self.req_to_token.device
            assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), (
                "graph buffers are allocated in the warm-up steps, never while capturing"
            )
            mid = self._alloc_mid(self.graph_max_bs, num_heads, head_dim, device)
            self._graph_mid[key] = mid
        return mid

    def init_forward_metadata(self, batch: AttentionBatch) -> None:
        extend_lens = batch.extend_lens
        host = torch.tensor(
            [batch.req_pool_indices_cpu, batch.prefix_lens, extend_lens, batch.extend_start_loc],
            dtype=torch.int32,
        )
        dev = upload(host, self.req_to_token.device)
        self.meta = TritonAttentionMetadata(
            req_rows=dev[0],
            seq_lens=dev[1] + dev[2],
            decode_only=all(e == 1 for e in extend_lens),
            prefix_lens=dev[1],
            extend_lens=dev[2],
            extend_starts=dev[3],
            max_extend_len=max(extend_lens, default=0),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayerInfo,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        meta = self.meta
        assert meta is not None
        n = q.shape[0]
        h, d = layer.num_heads, layer.head_dim
        k_buf, v_buf = self.kv_pool.get_kv_buffer(layer.layer_id)
        self.store_new_kv(k, v, layer, batch)
        q = q.view(n, h, d)
        out = torch.empty_like(q)
        if meta.decode_only:
            self._decode(
                q,
                k_buf,
                v_buf,
                out,
                self.req_to_token,
                meta.req_rows,
                meta.seq_lens,
                layer.scaling,
                layer.sliding_window,
                self._graph_mid_for(h, d) if meta.in_graph else None,
                layer.logit_softcap,
            )
        else:
            assert meta.prefix_lens is not None and meta.extend_lens is not None
            assert meta.extend_starts is not None
            self._extend(
                q,
                k_buf,
                v_buf,
                out,
                self.req_to_token,
                meta.req_rows,
                meta.prefix_lens,
                meta.extend_lens,
                meta.extend_starts,
                meta.max_extend_len,
                layer.scaling,
                layer.sliding_window,
                layer.logit_softcap,
            )
        return out.view(n, h * d)
