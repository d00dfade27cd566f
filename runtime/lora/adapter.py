"""A PEFT LoRA adapter read from its folder and checked against the base model (scheduler process).

A folder holds `adapter_config.json` and `adapter_model.safetensors` (PEFT's `save_pretrained`).
Everything this server cannot apply exactly is refused here, with the reason, before a slot is
touched: an adapter of embeddings or the LM head, DoRA, `modules_to_save` (full copies of base
modules), LoRA biases, per-module rank or alpha patterns, a rank over `--max-lora-rank`, a
module outside `--lora-target-modules`, or a tensor whose shape does not fit the base layer. A
refusal is an `InvalidRequestError` (400 over HTTP; a start-up error for `--lora-paths`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from radixgen.errors import InvalidRequestError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT module name -> (our linear layer under the decoder layer, shard within its fused output)
# NOTE: q/k/v and gate/up are fused matmuls here (causal_lm._FUSED): their adapters add to a
# slice of the fused output. Phi-3 checkpoints name the fused layers themselves: whole shards.
TARGETS: dict[str, tuple[str, int | None]] = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "qkv_proj": ("self_attn.qkv_proj", None),
    "o_proj": ("self_attn.o_proj", None),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "gate_up_proj": ("mlp.gate_up_proj", None),
    "down_proj": ("mlp.down_proj", None),
}
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_UNSUPPORTED_TARGETS = ("embed_tokens", "lm_head", "wte", "embed_out")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(.+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class LoraModuleWeights:
    """One targeted module's factors: A [r, in], B [out, r] (float32, on the CPU)."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True)
class LoraAdapter:
    """A checked adapter: its factors by (layer, PEFT module name) and its output scale."""

    name: str
    path: str
    rank: int
    scaling: float  # lora_alpha / r (rsLoRA: lora_alpha / sqrt(r))
    modules: dict[tuple[int, str], LoraModuleWeights]
    # what the adapter computes (its factors and scale), hashed: the prefix cache's namespace,
    # so a name reloaded with other weights never meets the KV of the old ones, and HiCache's
    # lower tiers find an adapter's blocks again after a restart
    digest: str = ""

    @property
    def target_names(self) -> set[str]:
        return {module for _, module in self.modules}


def refuse(name: str, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter {name!r} cannot be served: {reason}", "lora_path")


def _read_config(name: str, folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise refuse(name, f"{path} does not exist (a PEFT adapter folder holds {CONFIG_FILE})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise refuse(name, f"{path} is not readable JSON ({e})") from e
    if not isinstance(raw, dict):
        raise refuse(name, f"{path} is not a JSON object")
    return raw


def _named_targets(targets: str | Iterable[object] | None) -> list[str]:
    """The module names a config's `target_modules` names (a list, or a regex string)."""
    if isinstance(targets, str):
        return [t for t in _UNSUPPORTED_TARGETS if re.search(targets, t)]
    return [str(t) for t in targets or []]


def _check_config(name: str, raw: dict[str, Any]) -> tuple[int, float]:
    """(rank, scaling) of a config this server can apply; else the refusal naming why."""
    peft_type = str(raw.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise refuse(name, f"peft_type {peft_type} (only LORA adapters are served)")
    if raw.get("use_dora"):
        raise refuse(name, "DoRA (use_dora) is not supported")
    if raw.get("modules_to_save"):
        raise refuse(name, f"modules_to_save {raw['modules_to_save']} (full module copies)")
    if raw.get("lora_bias") or raw.get("bias") not in (None, "none"):
        raise refuse(name, "LoRA biases (bias / lora_bias) are not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if raw.get(key):
            raise refuse(name, f"{key} (a per-module rank or alpha) is not supported")
    bad = [t for t in _named_targets(raw.get("target_modules")) if t in _UNSUPPORTED_TARGETS]
    if bad:
        raise refuse(name, f"target module {bad[0]} (embeddings and the LM head) is not supported")
    try:
        rank, alpha = int(raw["r"]), float(raw.get("lora_alpha", raw["r"]))
    except (KeyError, TypeError, ValueError) as e:
        raise refuse(name, f"{CONFIG_FILE} has no valid r / lora_alpha ({e})") from e
    if rank < 1:
        raise refuse(name, f"rank r={rank} must be >= 1")
    scaling = alpha / math.sqrt(rank) if raw.get("use_rslora") else alpha / rank
    return rank, scaling


def _read_weights(name: str, folder: Path) -> dict[str, torch.Tensor]:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise refuse(name, f"{path} does not exist (PEFT's safetensors weights)")
    try:
        return load_file(str(path), device="cpu")
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise refuse(name, f"{path} is not a readable safetensors file ({e})") from e


def load_adapter(
    name: str,
    path: str,
    max_rank: int,
    allowed: frozenset[str],
    base_shapes: dict[str, tuple[int, int]],
    num_layers: int,
) -> LoraAdapter:
    """Read and check the adapter at `path`.

    max_rank: --max-lora-rank. allowed: the PEFT module names slots exist for.
    base_shapes: PEFT module name -> (in_features, out_features of its shard) in the base model.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise refuse(name, f"{path} is not a folder")
    rank, scaling = _check_config(name, _read_config(name, folder))
    if rank > max_rank:
        raise refuse(name, f"rank {rank} is over --max-lora-rank {max_rank}")
    factors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _read_weights(name, folder).items():
        m = _KEY.match(key)
        if m is None:
            if any(t in key for t in _UNSUPPORTED_TARGETS):
                raise refuse(name, f"tensor {key} adapts embeddings or the LM head")
            raise refuse(name, f"tensor {key} is not a LoRA factor of a decoder layer's linear")
        layer, module_path, which = int(m.group(1)), m.group(2), m.group(3)
        module = module_path.rsplit(".", 1)[-1]
        if module not in TARGETS or TARGETS[module][0].split(".")[0] != module_path.split(".")[0]:
            raise refuse(name, f"tensor {key} targets {module_path}, which has no LoRA slot here")
        if module not in allowed:
            raise refuse(name, f"target module {module} is not in --lora-target-modules")
        if not 0 <= layer < num_layers:
            raise refuse(name, f"tensor {key} names layer {layer}; the base has {num_layers}")
        factors.setdefault((layer, module), {})[which] = tensor.float()
    if not factors:
        raise refuse(name, f"{WEIGHTS_FILE} holds no LoRA factors")
    modules: dict[tuple[int, str], LoraModuleWeights] = {}
    for (layer, module), ab in sorted(factors.items()):
        if set(ab) != {"A", "B"}:
            raise refuse(name, f"layer {layer} {module} has lora_{next(iter(ab))} only")
        a, b = ab["A"], ab["B"]
        in_f, out_f = base_shapes[module]
        if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != (rank, in_f):
            raise refuse(
                name,
                f"shape mismatch with the base: layer {layer} {module} lora_A is "
                f"{tuple(a.shape)}, the base needs ({rank}, {in_f})",
            )
        if tuple(b.shape) != (out_f, rank):
            raise refuse(
                name,
                f"shape mismatch with the base: layer {layer} {module} lora_B is "
                f"{tuple(b.shape)}, the base needs ({out_f}, {rank})",
            )
        modules[(layer, module)] = LoraModuleWeights(a.contiguous(), b.contiguous())
    return LoraAdapter(name, str(folder), rank, scaling, modules, content_digest(modules, scaling))


def content_digest(modules: dict[tuple[int, str], LoraModuleWeights], scaling: float) -> str:
    """A hash of the factors (in a fixed order, with their shapes) and the scale."""
    h = hashlib.blake2b(repr(scaling).encode(), digest_size=16)
    for key in sorted(modules):
        w = modules[key]
        h.update(repr((key, tuple(w.a.shape), tuple(w.b.shape))).encode())
        h.update(w.a.contiguous().numpy().tobytes())
        h.update(w.b.contiguous().numpy().tobytes())
    return "lora:" + h.hexdigest()


def resolve_target_modules(flag: tuple[str, ...] | None) -> frozenset[str]:
    """--lora-target-modules -> the PEFT module names slots are allocated for."""
    if not flag or "all" in flag or "all-linear" in flag:
        return frozenset(TARGETS)
    unknown = sorted(set(flag) - set(TARGETS))
    if unknown:
        raise InvalidRequestError(
            f"--lora-target-modules {unknown[0]} is not one of {', '.join(DEFAULT_TARGETS)}",
            "lora_target_modules",
        )
    return frozenset(flag)
