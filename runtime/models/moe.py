"""Mixture-of-Experts decoders (Mixtral, Qwen2-MoE): top-k routed experts computed grouped.

Runs in the scheduler process. Each token's router picks its top-k experts (softmax first, then
top-k, renormalised for Mixtral and for Qwen2-MoE with norm_topk_prob); the (token, expert)
pairs are sorted by expert so each expert runs once, as two matmuls over all of its tokens, and
the weighted rows are summed back per token with one index_add. Python loops over experts,
never over tokens. Qwen2-MoE adds a shared expert scaled by a sigmoid gate.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.models.llama import MLP, DecoderLayer, Linear, LlamaForCausalLM
from radixgen.runtime.models.model_config import ModelArchConfig

_EXPERT_PARAMS = ("experts_gate_up", "experts_down")


def grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    """sum_k weights[t, k] * expert_{experts[t, k]}(x[t]) for every token t -> [N, H] float32.

    x: [N, H]; weights (float32) and experts (long): [N, k]; gate_up: [E, 2I, H]; down: [E, H, I].
    """
    n, k = experts.shape
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, tokens in order
    tokens = order // k
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    rows = x[tokens]
    out = torch.empty((n * k, x.shape[1]), dtype=torch.float32, device=x.device)
    inter = down.shape[2]
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        seg = rows[start : start + count]
        gu = F.linear(seg, gate_up[e])
        h = F.silu(gu[:, :inter]) * gu[:, inter:]
        out[start : start + count] = F.linear(h, down[e]).float()
        start += count
    out *= weights.reshape(-1)[order].unsqueeze(1)
    total = torch.zeros((n, x.shape[1]), dtype=torch.float32, device=x.device)
    return total.index_add_(0, tokens, out)


class SparseMoeBlock(nn.Module):
    """Router + stacked experts (+ Qwen2-MoE's gated shared expert)."""

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        h, e, inter = cfg.hidden_size, moe.num_experts, moe.intermediate_size
        self.top_k, self.renormalize = moe.top_k, moe.renormalize
        self.gate = Linear(h, e, bias=False)
        self.experts_gate_up = nn.Parameter(torch.empty(e, 2 * inter, h))
        self.experts_down = nn.Parameter(torch.empty(e, h, inter))
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: Linear | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = MLP(cfg, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate.forward(x)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = grouped_experts(x, weights, experts, self.experts_gate_up, self.experts_down)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            gate = torch.sigmoid(self.shared_expert_gate.forward(x).float())
            out += gate * self.shared_expert.forward(x).float()
        return out.to(x.dtype)


class MoeDecoderLayer(DecoderLayer):
    def make_mlp(self, cfg: ModelArchConfig, layer_id: int) -> nn.Module:
        assert cfg.moe is not None
        return SparseMoeBlock(cfg) if cfg.moe.sparse_layers[layer_id] else MLP(cfg)


class _MoeForCausalLM(LlamaForCausalLM):
    """Checkpoint names: one tensor per expert and projection (HF's layout); ours stack them."""

    layer_cls = MoeDecoderLayer
    # how the checkpoint names the MoE block and each expert's gate, up and down projections
    block_name: ClassVar[str] = "mlp"
    expert_names: ClassVar[tuple[str, str, str]] = ("gate_proj", "up_proj", "down_proj")

    def _moe_layers(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if isinstance(layer.mlp, SparseMoeBlock)]

    def checkpoint_names(self) -> set[str]:
        names = {
            n.replace(".mlp.", f".{self.block_name}.") if self._is_moe_name(n) else n
            for n in super().checkpoint_names()
            if not n.endswith(_EXPERT_PARAMS)
        }
        assert self.cfg.moe is not None
        for i in self._moe_layers():
            for e in range(self.cfg.moe.num_experts):
                for proj in self.expert_names:
                    names.add(f"model.layers.{i}.{self.block_name}.experts.{e}.{proj}.weight")
        return names

    def _is_moe_name(self, name: str) -> bool:
        parts = name.split(".")
        return len(parts) > 3 and parts[1] == "layers" and int(parts[2]) in self._moe_layers()

    def _destination(self, params: dict[str, nn.Parameter], name: str) -> torch.Tensor:
        parts = name.split(".")
        if len(parts) < 5 or parts[3] != self.block_name:
            return super()._destination(params, name)
        block = f"model.layers.{parts[2]}.mlp"
        if parts[4] != "experts":
            return super()._destination(params, ".".join([*parts[:3], "mlp", *parts[4:]]))
        expert, proj = int(parts[5]), self.expert_names.index(parts[6])
        prefix = block[len("model.") :]
        if proj == 2:
            return params[f"{prefix}.experts_down"][expert]
        inter = params[f"{prefix}.experts_down"].shape[2]
        return params[f"{prefix}.experts_gate_up"][expert, proj * inter : (proj + 1) * inter]

    def _shard_slice(self, target: str, shard: int) -> slice:
        if ".shared_expert." in target:  # its own intermediate size
            assert self.cfg.moe is not None
            inter = self.cfg.moe.shared_expert_intermediate_size
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
