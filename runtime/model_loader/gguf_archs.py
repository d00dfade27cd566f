"""GGUF conversion facts of the architectures beyond Llama / Mistral / Qwen2 (launcher or test).

llama.cpp stores some tensors differently from Hugging Face, and this module undoes each: Gemma 2
norms hold w + 1, Mixture-of-Experts layers stack all experts in one 3-D tensor per projection
(split back to one tensor per expert here), Qwen2-MoE's shared-expert gate is a vector, Phi-3
keeps fused qkv / gate_up tensors and its longrope factors as tensors. `arch_config` adds each
architecture's config keys from the metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# GGUF per-layer tensor -> HF module name, where an architecture differs from the Llama table
LAYER_OVERRIDES: dict[str, dict[str, str]] = {
    "qwen3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    "qwen3moe": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    "gemma2": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
# tensors that are config values, not module weights (read by `arch_config`)
CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
_EXPERT_PROJ = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}
_SHARED = {"ffn_gate_shexp": "gate_proj", "ffn_up_shexp": "up_proj", "ffn_down_shexp": "down_proj"}


def is_moe(meta: dict[str, Any], arch: str) -> bool:
    return int(meta.get(f"{arch}.expert_count") or 0) > 0


def arch_config(
    meta: dict[str, Any],
    arch: str,
    tensor_names: set[str],
    read_tensor: Callable[[str], np.ndarray],
) -> dict[str, Any]:
    """Config keys this architecture adds (or replaces) beyond the common ones."""

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    layers = int(get("block_count"))
    extra: dict[str, Any] = {}
    if arch in ("llama", "qwen2moe", "qwen3moe") and is_moe(meta, arch):
        experts, used = int(get("expert_count")), int(get("expert_used_count", 2))
        sparse = [f"blk.{i}.ffn_gate_inp.weight" in tensor_names for i in range(layers)]
        if arch == "llama":
            if not all(sparse):
                raise ValueError("a llama MoE GGUF needs ffn_gate_inp in every layer")
            extra = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}
            extra |= {"num_local_experts": experts, "num_experts_per_tok": used}
        else:
            extra = {
                "num_experts": experts,
                "num_experts_per_tok": used,
                "moe_intermediate_size": int(get("expert_feed_forward_length")),
                "shared_expert_intermediate_size": int(get("expert_shared_feed_forward_length", 0)),
                # NOTE: llama.cpp renormalises Qwen3-MoE's top-k weights, not Qwen2-MoE's
                "norm_topk_prob": bool(get("expert_weights_norm", arch == "qwen3moe")),
                "mlp_only_layers": [i for i, s in enumerate(sparse) if not s],
                "qkv_bias": "blk.0.attn_q.bias" in tensor_names,
            }
    elif arch == "gemma2":
        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        head_dim = int(get("attention.key_length", hidden // heads))
        extra = {
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            # NOTE: llama.cpp scales by head_dim, except for the 46-layer (27B) model
            "query_pre_attn_scalar": hidden // heads if layers == 46 else head_dim,
            "attn_logit_softcapping": get("attn_logit_softcapping"),
            "final_logit_softcapping": get("final_logit_softcapping"),
            "tie_word_embeddings": "output.weight" not in tensor_names,
        }
        if get("attention.sliding_window"):
            extra["sliding_window"] = int(get("attention.sliding_window"))
    elif arch == "phi3":
        if get("attention.sliding_window"):
            extra["sliding_window"] = int(get("attention.sliding_window"))
        if set(CONFIG_TENSORS) <= tensor_names:
            orig = int(get("rope.scaling.original_context_length"))
            scaling: dict[str, Any] = {
                "rope_type": "longrope",
                "long_factor": [float(f) for f in read_tensor(CONFIG_TENSORS[0])],
                "short_factor": [float(f) for f in read_tensor(CONFIG_TENSORS[1])],
                "original_max_position_embeddings": orig,
            }
            if get("rope.scaling.attn_factor") is not None:
                scaling["attention_factor"] = float(get("rope.scaling.attn_factor"))
            extra |= {"rope_scaling": scaling, "original_max_position_embeddings": orig}
    return extra


def special_tensor(
    arch: str, config: dict[str, Any], layer: str, part: str, kind: str, arr: np.ndarray
) -> list[tuple[str, np.ndarray]] | None:
    """HF (name, array) pairs for a per-layer GGUF tensor this module converts, else None."""
    moe_block = "block_sparse_moe" if config.get("model_type") == "mixtral" else "mlp"
    prefix = f"model.layers.{layer}"
    if part in _EXPERT_PROJ:
        names = ("w1", "w3", "w2") if moe_block == "block_sparse_moe" else _SHARED_NAMES
        proj = names[_EXPERT_PROJ[part]]
        return [
            (f"{prefix}.{moe_block}.experts.{e}.{proj}.{kind}", np.ascontiguousarray(arr[e]))
            for e in range(arr.shape[0])
        ]
    if part == "ffn_gate_inp":
        return [(f"{prefix}.{moe_block}.gate.{kind}", arr)]
    if part == "ffn_gate_inp_shexp":
        return [(f"{prefix}.mlp.shared_expert_gate.{kind}", arr.reshape(1, -1))]
    if part in _SHARED:
        return [(f"{prefix}.mlp.shared_expert.{_SHARED[part]}.{kind}", arr)]
    return None


_SHARED_NAMES = ("gate_proj", "up_proj", "down_proj")


def undo_norm_offset(arch: str, hf_name: str, arr: np.ndarray) -> np.ndarray:
    """Gemma 2 GGUFs store every RMSNorm weight as w + 1 (llama.cpp multiplies by it plainly)."""
    if arch == "gemma2" and hf_name.endswith("norm.weight"):
        shifted: np.ndarray = arr - np.float32(1.0)
        return shifted
    return arr
