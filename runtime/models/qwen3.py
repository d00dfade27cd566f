"""Qwen3 decoder: the Llama layout plus an RMSNorm over each q and k head before rotary.

Runs in the scheduler process. The norms run on the fused qkv rows, so the native rotary + KV
store kernel still takes them in one call.
"""

from __future__ import annotations

import torch

from radixgen.runtime.models.llama import Attention, DecoderLayer, LlamaForCausalLM, RMSNorm
from radixgen.runtime.models.model_config import ModelArchConfig


class Qwen3Attention(Attention):
    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__(cfg, layer_id)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """q and k normed per head (weights of head_dim values); v as projected."""
        qkv = super().project_qkv(x)
        n = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # NOTE: the norm returns the weight's dtype; float32 qkv (unrounded) comes back rounded,
        # as HF rounds the projection before its norm
        q = self.q_norm.forward(q.reshape(n, self.h, self.d)).reshape(n, self.q_size)
        k = self.k_norm.forward(k.reshape(n, self.hkv, self.d)).reshape(n, self.kv_size)
        return torch.cat((q, k, v.to(q.dtype)), dim=-1)


class Qwen3DecoderLayer(DecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3ForCausalLM (dense); attention_bias per config, tied or untied head."""

    layer_cls = Qwen3DecoderLayer
