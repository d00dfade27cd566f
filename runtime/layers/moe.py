"""Mixture-of-Experts feed-forward: top-k routed experts computed grouped (scheduler process).

Each token's router picks its top-k experts (softmax first, then top-k, renormalised for Mixtral
and for Qwen2-MoE with norm_topk_prob); the (token, expert) pairs are sorted by expert so each
expert runs once over all of its tokens, and the weighted rows are summed back per token with one
index_add: Python loops over experts, never tokens. Experts are our `MLP` modules (fused gate_up,
prepacked like every linear layer), so on the native GEMM a token's result does not depend on
which other tokens share its expert. Qwen2-MoE adds a shared expert scaled by a sigmoid gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.layers.mlp import MLP

if TYPE_CHECKING:
    from radixgen.runtime.models.model_config import ModelArchConfig


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
