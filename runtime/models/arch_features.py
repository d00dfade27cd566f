"""Architecture-specific config facts beyond the Llama core (any process; no torch).

Qwen3's per-head q/k norms, Gemma 2's soft-capping, scaling and activation, Mixture-of-Experts
routing; read from config.json by `ModelArchConfig.from_dict`, refused here when unsupported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from radixgen.errors import InvalidRequestError

# model_type -> the activation its MLP must use (config key: hidden_act, or Gemma's
# hidden_activation); anything else is refused
_ACTIVATIONS = {"gemma2": ("gelu_pytorch_tanh",)}


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "model_path")


@dataclass(frozen=True)
class MoeConfig:
    """Sparse feed-forward blocks: each token's top-k experts, optionally one shared expert."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert
    renormalize: bool  # top-k weights renormalised to sum to 1 (Mixtral: always)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's sigmoid-gated shared expert; 0: none
    sparse_layers: tuple[bool, ...] = ()  # per layer: MoE block (True) or dense MLP


def hidden_act(raw: dict[str, Any], model_type: str) -> str:
    act = str(raw.get("hidden_activation") or raw.get("hidden_act") or "silu")
    allowed = _ACTIVATIONS.get(model_type, ("silu",))
    if act not in allowed:
        raise _bad(f"hidden_act {act!r} is not supported for {model_type} ({', '.join(allowed)})")
    return act


def moe_config(raw: dict[str, Any], model_type: str, num_layers: int) -> MoeConfig | None:
    """The MoE layout of Mixtral (all layers sparse) or Qwen2-MoE / Qwen3-MoE
    (decoder_sparse_step and mlp_only_layers pick the sparse ones), else None."""
    if model_type == "mixtral":
        experts = int(raw.get("num_local_experts", 8))
        inter, shared, renorm = int(raw["intermediate_size"]), 0, True
        sparse = (True,) * num_layers
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        # NOTE: transformers 5 saves Qwen3-MoE's count as num_local_experts
        experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
        inter = int(raw.get("moe_intermediate_size", raw["intermediate_size"]))
        shared = int(raw.get("shared_expert_intermediate_size", 0))
        renorm = bool(raw.get("norm_topk_prob", False))
        step = int(raw.get("decoder_sparse_step", 1))
        dense = set(raw.get("mlp_only_layers") or [])
        sparse = tuple(
            i not in dense and experts > 0 and step > 0 and (i + 1) % step == 0
            for i in range(num_layers)
        )
    else:
        return None
    top_k = int(raw.get("num_experts_per_tok", 2))
    if experts <= 0 or not 0 < top_k <= experts:
        raise _bad(f"num_experts_per_tok {top_k} must be in 1..{experts} (the expert count)")
    return MoeConfig(experts, top_k, inter, renorm, shared, sparse)


def softcap(raw: dict[str, Any], key: str, model_type: str) -> float | None:
    """Gemma 2's soft-cap `key`, or None (other architectures have none)."""
    value = raw.get(key) if model_type == "gemma2" else None
    if value is None:
        return None
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise _bad(f"{key} must be a positive number, got {value}")
    return value


def longrope(scaling: dict[str, Any], raw: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """Phi-3's longrope ('su') scaling checked and completed: both factor lists of head_dim / 2
    values, the original context, and the cos/sin attention factor (HF's default when absent)."""
    orig = scaling.get("original_max_position_embeddings") or raw.get(
        "original_max_position_embeddings"
    )
    if orig is None:
        raise _bad("rope scaling 'longrope' lacks original_max_position_embeddings")
    for key in ("short_factor", "long_factor"):
        values = scaling.get(key)
        if not isinstance(values, list) or len(values) != head_dim // 2:
            raise _bad(f"rope scaling 'longrope' needs {key} with {head_dim // 2} values")
    factor = scaling.get("factor") or int(raw.get("max_position_embeddings", orig)) / int(orig)
    attn = scaling.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(int(orig)))
    return {
        **scaling,
        "rope_type": "longrope",
        "original_max_position_embeddings": int(orig),
        "attention_factor": float(attn),
    }
