"""Architecture facts read from a model folder's config.json (any process; no torch).

Everything the model code cannot honour (an unknown architecture or rope scaling, a non-SiLU MLP,
partial rotary embeddings) is refused here, at load time, with an error naming the problem.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixgen.errors import InvalidRequestError
from radixgen.runtime.models.arch_features import (
    MoeConfig,
    hidden_act,
    longrope,
    moe_config,
    softcap,
)

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def config_error(message: str) -> InvalidRequestError:
    """A 400 naming --model-path: the folder's config cannot be served."""
    return InvalidRequestError(message, "model_path")


def read_config_json(folder: str | Path) -> dict[str, Any]:
    """A Hugging Face model folder's config.json as a dict; a clear 400 naming the folder when
    it is missing or not a JSON object (decoders and encoders read it alike)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise config_error(f"{folder} has no config.json (not a Hugging Face model folder)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise config_error(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise config_error(f"{path} is not a JSON object")
    return raw


def missing_required_keys(raw: dict[str, Any]) -> list[str]:
    """The shape keys every supported architecture's config must have."""
    return [k for k in _REQUIRED_KEYS if k not in raw]


@dataclass(frozen=True)
class ModelArchConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    # NOTE: per layer, the attention window (keys within the last N positions) or None (full).
    layer_sliding_windows: tuple[int | None, ...] = ()
    # NOTE: per-frequency rope divisors from a GGUF's rope_freqs tensor (llama.cpp's form of
    # Llama 3.1+ rope scaling); head_dim / 2 values, or () for none
    rope_freq_factors: tuple[float, ...] = ()
    # architecture extras (arch_features.py): MLP activation, Qwen3's per-head q/k RMSNorm,
    # Gemma 2's attention / final logit soft-caps and query scale, MoE routing
    hidden_act: str = "silu"
    qk_norm: bool = False
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    moe: MoeConfig | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelArchConfig:
        cfg = cls.from_dict(read_config_json(folder))
        # NOTE: instruct models often list their end-of-turn token only in generation_config.json
        gen_path = Path(folder) / "generation_config.json"
        if gen_path.is_file():
            try:
                gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
            except (json.JSONDecodeError, AttributeError):
                gen_eos = None
            extra = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
            merged = list(dict.fromkeys([*cfg.eos_token_ids, *extra]))
            cfg = dataclasses.replace(cfg, eos_token_ids=merged)
        return cfg

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelArchConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise config_error(
                f"unsupported architecture {archs} (supported: {sorted(SUPPORTED_ARCHITECTURES)})"
            )
        missing = missing_required_keys(raw)
        if missing:
            raise config_error(f"config.json lacks {missing}")
        model_type = SUPPORTED_ARCHITECTURES[arch]
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise config_error(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        act = hidden_act(raw, model_type)
        eos = raw.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        attention_bias = bool(raw.get("attention_bias", False))
        rope_theta, rope_scaling = _rope(raw, model_type)
        num_layers = int(raw["num_hidden_layers"])
        windows = _layer_windows(raw, model_type, num_layers)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if rope_scaling is not None and rope_scaling["rope_type"] == "longrope":
            rope_scaling = longrope(rope_scaling, raw, head_dim)
        qwen2_like = model_type in ("qwen2", "qwen2_moe")
        qkv_bias = attention_bias or model_type == "qwen2"
        if model_type == "qwen2_moe":
            qkv_bias = bool(raw.get("qkv_bias", True))
        factors = tuple(float(f) for f in raw.get("rope_freq_factors") or ())
        if factors and len(factors) != head_dim // 2:
            raise config_error(
                f"rope_freq_factors has {len(factors)} values; head_dim {head_dim} needs {head_dim // 2}"
            )
        return cls(
            architecture=arch,
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=attention_bias and not qwen2_like,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=next((w for w in windows if w is not None), None),
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            layer_sliding_windows=windows,
            rope_freq_factors=factors,
            hidden_act=act,
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            # NOTE: only Gemma 2's modules apply the caps: elsewhere the keys are not read
            attn_logit_softcapping=softcap(raw, "attn_logit_softcapping", model_type),
            final_logit_softcapping=softcap(raw, "final_logit_softcapping", model_type),
            query_pre_attn_scalar=(
                float(raw.get("query_pre_attn_scalar") or head_dim)
                if model_type == "gemma2"
                else None
            ),
            moe=moe_config(raw, model_type, num_layers),
            raw=raw,
        )


def _rope(raw: dict[str, Any], model_type: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling or None) from the v4 (`rope_scaling`) or v5 (`rope_parameters`) form.

    longrope is Phi-3's (phi3.py keeps its two tables); other architectures refuse it."""
    given = raw.get("rope_parameters")
    params: dict[str, Any] = given if isinstance(given, dict) else {}
    scaling = raw.get("rope_scaling") or params or None
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    if scaling is not None:
        kind = scaling.get("rope_type") or scaling.get("type") or "default"
        kind = "longrope" if kind == "su" else kind  # Phi-3's first name for it
        supported = SUPPORTED_ROPE_TYPES if model_type == "phi3" else SUPPORTED_ROPE_TYPES[:3]
        if kind not in supported:
            raise config_error(
                f"rope scaling type {kind!r} is not supported for {model_type} "
                f"(supported: {supported})"
            )
        partial = float(scaling.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
        if partial != 1.0:
            raise config_error(f"partial_rotary_factor {partial} is not supported")
        needs = {
            "default": (),
            "linear": ("factor",),
            "llama3": ("factor", "original_max_position_embeddings"),
            "longrope": ("short_factor", "long_factor"),
        }
        lacking = [k for k in needs[kind] if k not in scaling]
        if lacking:
            raise config_error(f"rope scaling {kind!r} lacks {lacking}")
        scaling = None if kind == "default" else {**scaling, "rope_type": kind}
    return float(theta), scaling


def _layer_windows(raw: dict[str, Any], model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Which layers use sliding-window attention, following transformers' rules per architecture."""
    window = raw.get("sliding_window")
    qwen_like = model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
    if model_type == "llama" or window is None:
        return (None,) * num_layers
    if qwen_like and not raw.get("use_sliding_window", False):
        return (None,) * num_layers
    window = int(window)
    if window <= 0:
        raise config_error(f"sliding_window must be positive, got {window}")
    if model_type in ("mistral", "mixtral", "phi3"):
        return (window,) * num_layers
    types = raw.get("layer_types")
    if types is None and model_type == "gemma2":  # alternating, the first layer slides
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if types is None:
        first = int(raw.get("max_window_layers", num_layers))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers:
        raise config_error(f"layer_types has {len(types)} entries for {num_layers} layers")
    return tuple(window if t == "sliding_attention" else None for t in types)
