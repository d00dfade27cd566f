"""The pre-norm decoder block: x + attention(norm(x)), then + mlp(norm(.)) (scheduler process).

Llama, Mistral, Qwen2/3, Phi-3 and the MoE models differ only in the attention and feed-forward
modules they hand it; Gemma 2's sandwich norms are a block of their own (models/gemma2.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.norm import RMSNorm
from radixgen.runtime.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.models.model_config import ModelArchConfig


class DecoderLayer(nn.Module):
    """input_layernorm -> self_attn -> post_attention_layernorm -> mlp, float32 residual.

    The residual add is fused into the next norm: `forward` returns the mlp output and the
    residual before it is added (the next layer's, or the final, norm adds it)."""

    def __init__(self, cfg: ModelArchConfig, attention: Attention, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x.float()
            h = self.input_layernorm.forward(x)
        else:
            h, residual = self.input_layernorm.forward(x, residual)
        h = self.self_attn.forward(h, positions, rotary, batch)
        h, residual = self.post_attention_layernorm.forward(h, residual)
        out: torch.Tensor = self.mlp.forward(h)
        return out, residual
