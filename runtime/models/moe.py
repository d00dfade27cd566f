"""Mixture-of-Experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE): the pre-norm block whose
feed-forward is a `SparseMoeBlock` (runtime/layers/moe.py) on the sparse layers, and the
checkpoints' own names for the MoE block and its experts (scheduler process).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from radixgen.runtime.layers.attention import Attention, QKNormAttention
from radixgen.runtime.layers.decoder import DecoderLayer
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.layers.moe import SparseMoeBlock
from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig


class _MoeForCausalLM(CausalLM):
    """Checkpoint names differ from ours only in the MoE block's and the experts' names."""

    # the native decoder stack runs dense MLPs only
    native_stack_allowed = False
    # the attention of every layer: Mixtral's and Qwen2-MoE's plain, Qwen3-MoE's q/k-normed
    attention_cls: ClassVar[type[Attention]] = Attention
    # how the checkpoint names the MoE block and each expert's gate, up and down projections
    block_name: ClassVar[str] = "mlp"
    expert_names: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")

    def make_layer(self, cfg: ModelArchConfig, layer_id: int) -> DecoderLayer:
        """The MoE block on the config's sparse layers, a dense MLP on the others."""
        assert cfg.moe is not None
        sparse = cfg.moe.sparse_layers[layer_id]
        mlp: nn.Module = SparseMoeBlock(cfg) if sparse else MLP(cfg)
        return DecoderLayer(cfg, self.attention_cls(cfg, layer_id), mlp)

    def _to_hf(self, name: str) -> str:
        """Our name -> the checkpoint's (model.layers.L.mlp... only differs)."""
        parts = name.split(".")
        if len(parts) < 5 or parts[3] != "mlp":
            return name
        if parts[4] == "experts" and len(parts) > 6:
            proj = self.expert_names[("gate_proj", "up_proj", "down_proj").index(parts[6])]
            return ".".join([*parts[:3], self.block_name, "experts", parts[5], proj, *parts[7:]])
        return ".".join([*parts[:3], self.block_name, *parts[4:]])

    def _from_hf(self, name: str) -> str:
        """The checkpoint's name -> ours (inverse of `_to_hf`)."""
        parts = name.split(".")
        if len(parts) < 5 or parts[3] != self.block_name:
            return name
        if parts[4] == "experts" and len(parts) > 6:
            proj = ("gate_proj", "up_proj", "down_proj")[self.expert_names.index(parts[6])]
            return ".".join([*parts[:3], "mlp", "experts", parts[5], proj, *parts[7:]])
        return ".".join([*parts[:3], "mlp", *parts[4:]])

    def checkpoint_names(self) -> set[str]:
        return {self._to_hf(n) for n in super().checkpoint_names()}

    def _destination(self, params: dict[str, nn.Parameter], name: str) -> torch.Tensor:
        return super()._destination(params, self._from_hf(name))

    def _shard_slice(self, target: str, shard: int) -> slice:
        """gate_up halves of experts and the shared expert (their own intermediate sizes)."""
        moe = self.cfg.moe
        assert moe is not None
        if ".experts." in target or ".shared_expert." in target:
            inter = (
                moe.intermediate_size
                if ".experts." in target
                else moe.shared_expert_intermediate_size
            )
            return slice(shard * inter, (shard + 1) * inter)
        return super()._shard_slice(target, shard)


class MixtralForCausalLM(_MoeForCausalLM):
    """MixtralForCausalLM: every layer sparse, top-k renormalised, experts w1 (gate), w3 (up),
    w2 (down) under `block_sparse_moe`."""

    block_name = "block_sparse_moe"
    expert_names = ("w1", "w3", "w2")


class Qwen2MoeForCausalLM(_MoeForCausalLM):
    """Qwen2MoeForCausalLM: sparse layers per decoder_sparse_step / mlp_only_layers, a shared
    expert with a sigmoid gate, top-k renormalised only with norm_topk_prob."""


class Qwen3MoeForCausalLM(_MoeForCausalLM):
    """Qwen3MoeForCausalLM: Qwen3's q/k-normed attention, Qwen2-MoE's routing, no shared
    expert."""

    attention_cls = QKNormAttention
