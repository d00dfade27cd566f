"""Gemma 2 decoder: scaled embeddings, (1 + w) RMSNorms around both sublayers (sandwich norms),
GeGLU (tanh-approximated GELU), query_pre_attn_scalar, soft-capped attention and final logits,
sliding-window attention on alternating layers.

Runs in the scheduler process. Attention logit soft-capping runs in the triton backend, or on
CPU in the torch backend's pure-torch path (the model runner routes Gemma 2 there); rotary + KV
store and the GEMMs stay native.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixgen.kernels.step_cancel import raise_if_cancelled
from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.mlp import GeluTanhMLP
from radixgen.runtime.layers.norm import GemmaRMSNorm
from radixgen.runtime.layers.rotary import RotaryEmbedding
from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch


class Gemma2DecoderLayer(nn.Module):
    """Norms before and after attention and before and after the MLP; float32 residual."""

    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        assert cfg.query_pre_attn_scalar is not None
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.self_attn = Attention(
            cfg,
            layer_id,
            scaling=cfg.query_pre_attn_scalar**-0.5,
            logit_softcap=cfg.attn_logit_softcapping,
        )
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.mlp = GeluTanhMLP(cfg)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output (the embeddings for the first layer)."""
        residual = x.float() if residual is None else residual + x.float()
        h = self.input_layernorm.forward(residual)
        h = self.self_attn.forward(h, positions, rotary, batch)
        residual = residual + self.post_attention_layernorm.forward(h).float()
        h = self.mlp.forward(self.pre_feedforward_layernorm.forward(residual))
        return self.post_feedforward_layernorm.forward(h), residual


class Gemma2ForCausalLM(CausalLM):
    """Gemma2ForCausalLM; logits are float32 after soft-capping (exact for every consumer)."""

    norm_cls = GemmaRMSNorm

    def make_layer(self, cfg: ModelArchConfig, layer_id: int) -> Gemma2DecoderLayer:
        return Gemma2DecoderLayer(cfg, layer_id)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        # NOTE: the normaliser is rounded to the model dtype first, as transformers does (a
        # host float: no CPU tensor meets a CUDA one, in or out of a graph capture)
        x = self.embed_tokens(input_ids)
        x = x * float(torch.tensor(self.cfg.hidden_size**0.5, dtype=x.dtype))
        residual = None
        cancel = batch.cancel
        for layer in self.layers:
            raise_if_cancelled(cancel)
            x, residual = layer.forward(x, residual, positions, self.rotary, batch)
        assert residual is not None
        idx = batch.logits_indices
        if idx is not None:
            x, residual = x[idx], residual[idx]
        h: torch.Tensor = self.norm.forward(x, residual)[0]
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """cap * tanh(logits / cap) in float32 (a bf16 near-max refinement would undo the cap)."""
        logits = super().compute_logits(hidden).float()
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
