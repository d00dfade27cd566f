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

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "model_path")


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
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelArchConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise _bad(f"{folder} has no config.json (not a Hugging Face model folder)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise _bad(f"{path} is not valid JSON: {e}") from e
        cfg = cls.from_dict(raw)
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
            raise _bad(
                f"unsupported architecture {archs} (supported: {sorted(SUPPORTED_ARCHITECTURES)})"
            )
        missing = [k for k in _REQUIRED_KEYS if k not in raw]
        if missing:
            raise _bad(f"config.json lacks {missing}")
        model_type = SUPPORTED_ARCHITECTURES[arch]
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise _bad(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise _bad(f"hidden_act {act!r} is not supported (silu only)")
        eos = raw.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        attention_bias = bool(raw.get("attention_bias", False))
        rope_theta, rope_scaling = _rope(raw)
        num_layers = int(raw["num_hidden_layers"])
        windows = _layer_windows(raw, model_type, num_layers)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        factors = tuple(float(f) for f in raw.get("rope_freq_factors") or ())
        if factors and len(factors) != head_dim // 2:
            raise _bad(
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
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=next((w for w in windows if w is not None), None),
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            layer_sliding_windows=windows,
            rope_freq_factors=factors,
            raw=raw,
        )


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling or None) from the v4 (`rope_scaling`) or v5 (`rope_parameters`) form."""
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    scaling = raw.get("rope_scaling") or params or None
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    if scaling is not None:
        kind = scaling.get("rope_type") or scaling.get("type") or "default"
        if kind not in SUPPORTED_ROPE_TYPES:
            raise _bad(
                f"rope scaling type {kind!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})"
            )
        partial = float(scaling.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
        if partial != 1.0:
            raise _bad(f"partial_rotary_factor {partial} is not supported")
        needs = {
            "default": (),
            "linear": ("factor",),
            "llama3": ("factor", "original_max_position_embeddings"),
        }
        lacking = [k for k in needs[kind] if k not in scaling]
        if lacking:
            raise _bad(f"rope scaling {kind!r} lacks {lacking}")
        scaling = None if kind == "default" else {**scaling, "rope_type": kind}
    return float(theta), scaling


def _layer_windows(raw: dict[str, Any], model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Which layers use sliding-window attention, following transformers' rules per architecture."""
    window = raw.get("sliding_window")
    if model_type == "llama" or window is None:
        return (None,) * num_layers
    window = int(window)
    if window <= 0:
        raise _bad(f"sliding_window must be positive, got {window}")
    if model_type == "mistral":
        return (window,) * num_layers
    if not raw.get("use_sliding_window", False):  # qwen2
        return (None,) * num_layers
    types = raw.get("layer_types")
    if types is None:
        first = int(raw.get("max_window_layers", num_layers))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers:
        raise _bad(f"layer_types has {len(types)} entries for {num_layers} layers")
    return tuple(window if t == "sliding_attention" else None for t in types)
