"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2): the pre-norm block of attention
and a SiLU-gated MLP, RMSNorms, the plain rotary table (scheduler process).

Biases (Qwen2's q/k/v) and rope scaling come from the config; the layers are runtime/layers'
and everything around them (loading, prepacking, the native decoder stack, logits) is
`CausalLM`'s.
"""

from __future__ import annotations

from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.decoder import DecoderLayer
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig


class LlamaForCausalLM(CausalLM):
    """Covers LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (biases per config)."""

    def make_layer(self, cfg: ModelArchConfig, layer_id: int) -> DecoderLayer:
        return DecoderLayer(cfg, Attention(cfg, layer_id), MLP(cfg))
