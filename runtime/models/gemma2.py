"""Gemma 2 decoder: scaled embeddings, (1 + w) RMSNorms around both sublayers (sandwich norms),
GeGLU (tanh-approximated GELU), query_pre_attn_scalar, soft-capped attention and final logits,
sliding-window attention on alternating layers.

Runs in the scheduler process. Attention logit soft-capping runs in the triton backend, or on
CPU in the torch backend's pure-torch path (the model runner routes Gemma 2 there); rotary + KV
store and the GEMMs stay native.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixgen.runtime.models.llama import (
    MLP,
    Attention,
    DecoderLayer,
    LlamaForCausalLM,
    RMSNorm,
    RotaryEmbedding,
)
from radixgen.runtime.models.model_config import ModelArchConfig

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch


class GemmaRMSNorm(RMSNorm):
    """x / rms(x) * (1 + w), in float32 (checkpoints store w around 0)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = residual + x.float()
            residual = x
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        normed = (normed * (1.0 + self.weight.float())).to(self.weight.dtype)
        return normed if residual is None else (normed, residual)


class Gemma2Attention(Attention):
    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__(cfg, layer_id)
        assert cfg.query_pre_attn_scalar is not None
        self.info = dataclasses.replace(
            self.info,
            scaling=cfg.query_pre_attn_scalar**-0.5,
            logit_softcap=cfg.attn_logit_softcapping,
        )


class Gemma2MLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).split(self.inter, dim=-1)
        return self.down_proj.forward(F.gelu(gate, approximate="tanh") * up)


class Gemma2DecoderLayer(DecoderLayer):
    """Norms before and after attention and before and after the MLP; float32 residual."""

    attention_cls = Gemma2Attention

    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__(cfg, layer_id)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def make_mlp(self, cfg: ModelArchConfig, layer_id: int) -> Gemma2MLP:
        return Gemma2MLP(cfg)

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


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma2ForCausalLM; logits are float32 after soft-capping (exact for every consumer)."""

    layer_cls = Gemma2DecoderLayer

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__(cfg, max_positions)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        # NOTE: the normaliser is rounded to the model dtype first, as transformers does (a
        # host float: no CPU tensor meets a CUDA one, in or out of a graph capture)
        x = self.embed_tokens(input_ids)
        x = x * float(torch.tensor(self.cfg.hidden_size**0.5, dtype=x.dtype))
        residual = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, positions, self.rotary, batch)
        assert residual is not None
        idx = batch.logits_indices
        if idx is not None:
            x, residual = x[idx], residual[idx]
        h, _ = self.norm.forward(x, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """cap * tanh(logits / cap) in float32 (a bf16 near-max refinement would undo the cap)."""
        logits = super().compute_logits(hidden).float()
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
