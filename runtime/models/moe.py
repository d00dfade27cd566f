"""Mixture-of-Experts decoders (Mixtral, Qwen2-MoE): top-k routed experts computed grouped.

Runs in the scheduler process. Each token's router picks its top-k experts (softmax first, then
top-k, renormalised for Mixtral and for Qwen2-MoE with norm_topk_prob); the (token, expert)
pairs are sorted by expert so each expert runs once over all of its tokens, and the weighted
rows are summed back per token with one index_add: Python loops over experts, never tokens.
Experts are our `MLP` modules (fused gate_up, prepacked like every linear layer), so on the
native GEMM a token's result does not depend on which other tokens share its expert. Qwen2-MoE
adds a shared expert scaled by a sigmoid gate.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from radixgen.runtime.models.llama import MLP, DecoderLayer, Linear, LlamaForCausalLM
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.models.qwen3 import Qwen3Attention


def grouped_experts(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, modules: nn.ModuleList
) -> torch.Tensor:
    """sum_k weights[t, k] * expert_{experts[t, k]}(x[t]) for every token t -> [N, H] float32.

    x: [N, H]; weights (float32) and experts (long): [N, k]; modules: the E expert MLPs.
    """
    n, k = experts.shape
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
    tokens = order // k
    # NOTE: one host read per layer (the group sizes); it keeps MoE layers out of CUDA graphs
    counts = torch.bincount(flat, minlength=len(modules)).tolist()
    # NOTE: index_select, not x[tokens]: CPU advanced indexing costs ~80 us a call here
    rows = x.index_select(0, tokens)
    out = torch.empty((n * k, x.shape[1]), dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in zip(modules, counts, strict=True):
        if count:
            out[start : start + count] = expert.forward(rows[start : start + count]).float()
            start += count
    out *= weights.reshape(-1).index_select(0, order).unsqueeze(1)
    total = torch.zeros((n, x.shape[1]), dtype=torch.float32, device=x.device)
    return total.index_add_(0, tokens, out)


class SparseMoeBlock(nn.Module):
    """Router + experts (+ Qwen2-MoE's gated shared expert)."""

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        self.top_k, self.renormalize = moe.top_k, moe.renormalize
        self.gate = Linear(cfg.hidden_size, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(cfg, moe.intermediate_size) for _ in range(moe.num_experts)
        )
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: Linear | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = MLP(cfg, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate.forward(x)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = grouped_experts(x, weights, experts, self.experts)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            gate = torch.sigmoid(self.shared_expert_gate.forward(x).float())
            out += gate * self.shared_expert.forward(x).float()
        return out.to(x.dtype)


class MoeDecoderLayer(DecoderLayer):
    def make_mlp(self, cfg: ModelArchConfig, layer_id: int) -> nn.Module:
        assert cfg.moe is not None
        return SparseMoeBlock(cfg) if cfg.moe.sparse_layers[layer_id] else MLP(cfg)


class _MoeForCausalLM(LlamaForCausalLM):
    """Checkpoint names differ from ours only in the MoE block's and the experts' names."""

    layer_cls = MoeDecoderLayer
    # how the checkpoint names the MoE block and each expert's gate, up and down projections
    block_name: ClassVar[str] = "mlp"
    expert_names: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")

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


class Qwen3MoeDecoderLayer(MoeDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3MoeForCausalLM(_MoeForCausalLM):
    """Qwen3MoeForCausalLM: Qwen3's q/k-normed attention, Qwen2-MoE's routing, no shared
    expert."""

    layer_cls = Qwen3MoeDecoderLayer
