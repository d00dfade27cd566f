"""Attention over the paged KV pool with flashinfer's kernels (the GPU path's default).

Decode-only steps run flashinfer's paged decode (CUDA cores: the default model's GQA group of 3
is below where tensor-core decode pays). A step with any extend runs two calls per layer: ragged
causal attention over the new tokens' own K/V, and paged non-causal attention over the cached
prefix, joined by `merge_state` on their log-sum-exps (no prefix in the batch: the ragged call
alone); decode rows in such a step ride along as 1-token extends.

Each wrapper's `plan()` (host-side scheduling, sized by the batch) runs once per step, on the
first layer, and every layer reuses it: the wrappers need the query head count and the softmax
scale, which only a layer's info carries. Decode in CUDA graphs uses one wrapper per captured
batch size over fixed-address index buffers, planned before each capture and replay, outside the
graph. The prefill wrappers use flashinfer's FA2 kernels (sm_90's FA3 default would compile on
the device: the carried prebuilt modules are FA2, see scripts/build_flashinfer_aot.py).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import AttentionBackend, AttentionBatch, AttentionLayerInfo, KVPool, ReqToTokenPool
from .flashinfer_metadata import StepLayout, graph_step_layout, step_layout

# one float workspace shared by every wrapper (split-KV partials; the docs suggest 128 MB)
WORKSPACE_BYTES = 256 * 1024 * 1024


class FlashInferAttentionBackend(AttentionBackend):
    """layer_info: any layer's geometry (heads, scale), needed before the first forward only by
    the CUDA-graph hooks; eager steps learn it from the first layer."""

    supports_cuda_graph = True

    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token_pool: ReqToTokenPool,
        page_size: int,
        layer_info: AttentionLayerInfo | None = None,
    ) -> None:
        # NOTE: imported here so that choosing another backend never imports flashinfer
        try:
            import flashinfer
        except ImportError as exc:
            raise ImportError(
                "--attention-backend flashinfer needs flashinfer-python 0.6.13 (on the GPU "
                "machine: from the carried wheels, scripts/gpu_check.sh); or use triton"
            ) from exc

        self._fi: Any = flashinfer
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.device_req_to_token
        self.page_size = page_size
        k_buf, _ = kv_pool.get_kv_buffer(0)
        self.device = k_buf.device
        self.dtype = k_buf.dtype
        self.num_kv_heads, self.head_dim = int(k_buf.shape[1]), int(k_buf.shape[2])
        if self.dtype not in (torch.bfloat16, torch.float16):
            # NOTE: the carried prebuilt modules are bf16 (fp16 would compile on first use)
            raise ValueError(
                f"--attention-backend flashinfer runs bf16 or fp16, not {self.dtype} "
                "(use triton or torch)"
            )
        self._geometry: tuple[int, float] | None = (
            None if layer_info is None else (layer_info.num_heads, layer_info.scaling)
        )
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, "NHD", backend="fa2"
        )
        self._prefix = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", backend="fa2"
        )
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._step = StepLayout("idle")

    # --- per step -----------------------------------------------------------------------------

    def init_forward_metadata(self, batch: AttentionBatch) -> None:
        self._step = step_layout(batch, self.req_to_token, self.page_size)

    def _plan(self, step: StepLayout, geometry: tuple[int, float]) -> None:
        """Host-side planning of this step's wrappers (once per step: layers share it).

        NOTE: a wrapper's plan fills its pinned host buffer and queues a copy of it to the
        device on the current stream, without waiting: planning step N+1 before the GPU has
        started step N (whose first work is that copy) would overwrite it. Overlap scheduling
        must launch step N+1 only once step N-1 is done (as handling N-1's results implies).
        """
        heads, scale = geometry
        common: dict[str, Any] = {
            "q_data_type": self.dtype,
            "kv_data_type": self.dtype,
            "sm_scale": scale,
        }
        paged = step.paged
        assert paged is not None
        if step.kind == "decode":
            self._decode.plan(
                paged.indptr,
                paged.indices,
                paged.last_page_len,
                heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                **common,
            )
        elif step.kind == "graph":
            self._graph_wrappers[step.graph_bs].plan(
                paged.indptr,
                paged.indices,
                paged.last_page_len,
                heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                **common,
            )
        else:
            assert step.qo_indptr is not None
            self._ragged.plan(
                step.qo_indptr,
                step.qo_indptr,
                heads,
                self.num_kv_heads,
                self.head_dim,
                causal=True,
                **common,
            )
            if step.has_prefix:
                self._prefix.plan(
                    step.qo_indptr,
                    paged.indptr,
                    paged.indices,
                    paged.last_page_len,
                    heads,
                    self.num_kv_heads,
                    self.head_dim,
                    self.page_size,
                    causal=False,
                    **common,
                )
        step.planned = geometry
        self._geometry = geometry

    # --- per layer ----------------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayerInfo,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        step = self._step
        n = q.shape[0]
        h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        if step.kind == "idle" or n == 0:
            return q.new_empty((n, h * d))
        if layer.sliding_window is not None:
            raise NotImplementedError(
                "the flashinfer backend has no sliding-window kernels (use triton or torch)"
            )
        k_buf, v_buf = self.kv_pool.get_kv_buffer(layer.layer_id)
        self.store_new_kv(k, v, layer, batch)
        geometry = (h, layer.scaling)
        if step.planned != geometry:
            if step.kind == "graph":  # planning inside a captured graph is impossible
                raise RuntimeError(
                    f"flashinfer decode graph planned for (heads, scale) {step.planned}, "
                    f"layer {layer.layer_id} has {geometry}"
                )
            self._plan(step, geometry)
        q = q.view(n, h, d)
        paged_cache = (
            k_buf.view(-1, self.page_size, hkv, d),
            v_buf.view(-1, self.page_size, hkv, d),
        )
        if step.kind == "decode":
            out = self._decode.run(q, paged_cache)
        elif step.kind == "graph":
            out = self._graph_wrappers[step.graph_bs].run(q, paged_cache)
        else:
            if k is None or v is None:  # the new tokens' K/V, from where the caller put them
                k, v = k_buf[batch.out_cache_loc], v_buf[batch.out_cache_loc]
            else:  # [N, Hkv*D] from the caller: flashinfer reads heads from dim 1
                k, v = k.view(n, hkv, d), v.view(n, hkv, d)
            out, lse = self._ragged.run(q, k, v, return_lse=True)
            if step.has_prefix:
                prefix_out, prefix_lse = self._prefix.run(q, paged_cache, return_lse=True)
                # NOTE: rows without a prefix have an empty paged part (lse -inf): merging keeps
                # their ragged output
                self._fi.merge_state_in_place(out, lse, prefix_out, prefix_lse)
        result: torch.Tensor = out
        return result.view(n, h * d)

    # --- CUDA graphs (decode steps only) ------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        max_pages = max_bs * -(-max_context_len // self.page_size)
        i32 = torch.int32
        self._graph_buffers = (
            torch.zeros(max_bs + 1, dtype=i32, device=self.device),  # kv_indptr
            torch.zeros(max_pages, dtype=i32, device=self.device),  # kv_indices
            torch.zeros(max_bs, dtype=i32, device=self.device),  # kv_last_page_len
        )
        self._graph_wrappers = {}

    def init_forward_metadata_graph(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor, seq_lens_host: list[int]
    ) -> None:
        if self._graph_buffers is None:
            raise RuntimeError("init_cuda_graph_state must run before the graph hooks")
        if self._geometry is None:
            raise RuntimeError(
                "the flashinfer backend plans graphs with the model's head count and scale: "
                "pass layer_info to create_attention_backend"
            )
        if bs not in self._graph_wrappers:
            indptr, indices, last = self._graph_buffers
            # NOTE: every bucket's wrapper reads the same fixed buffers (one bucket runs at a
            # time, planned just before): their addresses are what the graphs record
            self._graph_wrappers[bs] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=indptr[: bs + 1],
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last[:bs],
            )
        step = graph_step_layout(bs, req_rows, seq_lens_host, self.req_to_token, self.page_size)
        self._plan(step, self._geometry)
        self._step = step
