"""Write a tiny HF checkpoint as a GGUF the way llama.cpp's converter lays out these
architectures (Qwen3, Gemma 2, Phi-3, llama-arch MoE = Mixtral, Qwen2-MoE), float32.

Written independently of our converter from llama.cpp's documented layout: Gemma 2 norms stored
as w + 1, experts stacked per projection into [E, rows, cols] tensors, Qwen2-MoE's shared-expert
gate as a vector, Phi-3's longrope factors as tensors, llama q/k rows permuted for its rope.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf_blocks import gguf_name, llama_cpp_permute
from safetensors.numpy import load_file

_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$"
)
_EXPERT_GGUF = {
    "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps",
    "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
}  # fmt: skip
_RENAMES = {
    "gemma2": {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
    "qwen3": {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"},
    "qwen3moe": {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"},
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
}
_MOE_PARTS = {
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}


def checkpoint_state(folder: Path) -> dict[str, np.ndarray]:
    """The saved checkpoint's tensors under their on-disk (per-expert) names."""
    state: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _name(arch: str, hf: str) -> str:
    base, _, kind = hf.rpartition(".")
    parts = base.split(".")
    if len(parts) > 3 and parts[1] == "layers":
        rest = ".".join(parts[3:])
        table = {**_RENAMES.get(arch, {}), **_MOE_PARTS}
        if rest in table:
            return f"blk.{parts[2]}.{table[rest]}.{kind}"
    return gguf_name(hf)


def write_arch_gguf(path: Path, arch: str, cfg: Any, state: dict[str, np.ndarray]) -> None:
    """`state`: HF on-disk names, float32. `arch`: the GGUF architecture name."""
    w = gguf.GGUFWriter(str(path), arch)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    if arch == "phi3" and rope.get("rope_type") == "longrope":
        orig = rope["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        scale = cfg.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(orig))))
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    if arch in ("llama", "qwen2moe", "qwen3moe"):
        n_exp = getattr(cfg, "num_local_experts", None) or cfg.num_experts
        w.add_expert_count(n_exp)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    for name, arr in state.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        m = _EXPERT.match(name)
        if m:
            experts.setdefault((int(m.group(1)), _EXPERT_GGUF[m.group(3)]), {})[int(m.group(2))] = (
                arr
            )
            continue
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            arr = llama_cpp_permute(arr, heads if "q_proj" in name else kv_heads)
        if arch == "gemma2" and name.endswith("norm.weight"):
            arr = arr + np.float32(1.0)
        if name.endswith("shared_expert_gate.weight"):
            arr = arr.reshape(-1)
        w.add_tensor(_name(arch, name), arr)
    for (layer, part), per_expert in sorted(experts.items()):
        stacked = np.stack([per_expert[e] for e in range(len(per_expert))])
        w.add_tensor(f"blk.{layer}.{part}.weight", stacked)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
