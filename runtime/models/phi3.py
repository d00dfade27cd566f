"""Phi-3 decoder: the Llama layout with q/k/v and gate/up already fused in the checkpoint, and
longrope ("su") rotary scaling (`LongRopeRotaryEmbedding`, runtime/layers/rotary.py: each
token reads the short or the long table by its request's length) (scheduler process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.decoder import DecoderLayer
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.layers.rotary import LongRopeRotaryEmbedding
from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch


class Phi3ForCausalLM(CausalLM):
    """Phi3ForCausalLM: checkpoint tensors qkv_proj and gate_up_proj are ours as they are."""

    rotary_cls = LongRopeRotaryEmbedding

    def make_layer(self, cfg: ModelArchConfig, layer_id: int) -> DecoderLayer:
        return DecoderLayer(cfg, Attention(cfg, layer_id), MLP(cfg))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        rotary = self.rotary
        assert isinstance(rotary, LongRopeRotaryEmbedding)
        return super().forward(input_ids, rotary.table_rows(positions, batch), batch)

    def checkpoint_names(self) -> set[str]:
        return {
            "lm_head.weight" if name == "lm_head" else f"model.{name}"
            for name, _ in self.named_parameters()
        }
