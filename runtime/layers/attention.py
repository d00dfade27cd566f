"""Self-attention over the paged KV pool: fused q/k/v projection, rotary, the step's attention
backend, output projection; and the variant with per-head q/k norms (scheduler process).

The batch is flat: N new tokens from many requests, each with its own position; the attention
backend knows which request each token belongs to.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.attention.base import AttentionLayerInfo, kv_scales
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.layers.norm import RMSNorm
from radixgen.runtime.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from radixgen.kernels.layer_ops import FusedLayerOps
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.models.model_config import ModelArchConfig


class Attention(torch.nn.Module):
    """q/k/v in one matmul, rotary, the backend's attention, o_proj.

    scaling (default head_dim ** -0.5) and logit_softcap: what the backend applies to scores.
    """

    native: FusedLayerOps | None = None  # rotary + KV store fused (set by `prepack`)

    def __init__(
        self,
        cfg: ModelArchConfig,
        layer_id: int,
        scaling: float | None = None,
        logit_softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.h * self.d, self.hkv * self.d
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        window = cfg.layer_sliding_windows[layer_id] if cfg.layer_sliding_windows else None
        self.info = AttentionLayerInfo(layer_id, self.h, self.hkv, self.d, self.d**-0.5, window)
        if scaling is not None or logit_softcap is not None:
            self.info = dataclasses.replace(
                self.info,
                scaling=self.info.scaling if scaling is None else scaling,
                logit_softcap=logit_softcap,
            )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        n = x.shape[0]
        backend = batch.attn_backend
        assert backend is not None  # set by ModelRunner.forward
        # NOTE: the native path takes float32 projections where the GEMM can give them: rotary
        # runs in float32 and q, k, v are rounded to bf16 once instead of three times (the
        # residual stream, o_proj and down_proj likewise stay float32; see `linear`). On CUDA
        # the torch matmul returns the model dtype: the Triton ops then round as torch does.
        qkv = self.project_qkv(x)
        if self.native is not None:  # rotary + KV store in one call, straight into the pool
            k_buf, v_buf = backend.kv_pool.get_kv_buffer(self.info.layer_id)
            q = self.native.rope_store_kv(
                qkv, positions, rotary.cos, rotary.sin, k_buf, v_buf, batch.out_cache_loc,
                self.h, self.hkv, self.d, x.dtype, kv_scales(backend.kv_pool, self.info.layer_id),
            )  # fmt: skip
            out = backend.forward(q.view(n, self.q_size), None, None, self.info, batch)
            return self.o_proj.forward(out, unrounded=True)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)  # type: ignore[no-untyped-call]  # unannotated in torch
        q, k = rotary.forward(positions, q.view(n, self.h, self.d), k.view(n, self.hkv, self.d))
        out = backend.forward(
            q.reshape(n, self.q_size), k.reshape(n, self.kv_size), v, self.info, batch
        )
        return self.o_proj.forward(out)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The fused [N, (H + 2 Hkv) D] projection before rotary (a hook for per-head q/k norms)."""
        return self.qkv_proj.forward(x, unrounded=self.native is not None)


class QKNormAttention(Attention):
    """Qwen3's attention: an RMSNorm over each q and k head before rotary. The norms run on the
    fused qkv rows, so the native rotary + KV store kernel still takes them in one call."""

    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__(cfg, layer_id)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """q and k normed per head (weights of head_dim values); v as projected."""
        qkv = super().project_qkv(x)
        n = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)  # type: ignore[no-untyped-call]
        # NOTE: the norm returns the weight's dtype; float32 qkv (unrounded) comes back rounded,
        # as HF rounds the projection before its norm
        q = self.q_norm.forward(q.reshape(n, self.h, self.d)).reshape(n, self.q_size)
        k = self.k_norm.forward(k.reshape(n, self.hkv, self.d)).reshape(n, self.kv_size)
        return torch.cat((q, k, v.to(q.dtype)), dim=-1)
