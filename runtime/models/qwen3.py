"""Qwen3 decoder: the Llama layout plus an RMSNorm over each q and k head before rotary
(`QKNormAttention`) (scheduler process)."""

from __future__ import annotations

from radixgen.runtime.layers.attention import QKNormAttention
from radixgen.runtime.layers.decoder import DecoderLayer
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig


class Qwen3ForCausalLM(CausalLM):
    """Qwen3ForCausalLM (dense); attention_bias per config, tied or untied head."""

    def make_layer(self, cfg: ModelArchConfig, layer_id: int) -> DecoderLayer:
        return DecoderLayer(cfg, QKNormAttention(cfg, layer_id), MLP(cfg))
