"""Load a model with its linear weights kept quantized (scheduler process): `--quantization`.

- gguf: the GGUF's Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K tensors are read as raw blocks, split into integer planes
  (gguf_blocks.py) and packed for the native quantized GEMM (kernels/cpu/gemm_quant.c); other
  tensors (norms, and block types not kept) are dequantized as today. Fused q/k/v and gate/up
  stay quantized when their parts share a format, else they are dequantized too.
- w8a16 / int8: a dense checkpoint is loaded, then every linear weight (and a tied embedding) is
  quantized to int8 with one scale per output channel.
The dense copy of a quantized weight is released: only the packed bytes stay in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixgen.errors import InvalidRequestError
from radixgen.kernels.cpu import QuantLinearWeight, load_native_kernels
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.model_loader.gguf_blocks import (
    KEPT_TYPES,
    QuantPlanes,
    concat_rows,
    quantize_int8_per_channel,
    split_blocks,
)
from radixgen.runtime.model_loader.gguf_convert import _ROPE_FREQS, _hf_name
from radixgen.utils import return_free_heap_to_os

if TYPE_CHECKING:
    from radixgen.kernels.cpu import NativeKernels
    from radixgen.runtime.models.causal_lm import CausalLM

QUANTIZATIONS = ("gguf", "unquant", "w8a16", "int8")
# architectures whose modules this loader fills (the Llama-family decoder of models/llama.py)
QUANT_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")

_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def gguf_source(folder: str | Path) -> Path | None:
    """The GGUF file a converted folder was made from (gguf_convert.py records it), if any."""
    done = Path(folder) / "radixgen_done.json"
    try:
        source = Path(json.loads(done.read_text())["source"])
    except (OSError, ValueError, KeyError):
        return None
    return source if source.exists() else None


def keeps_quantized(requested: str | None, folder: str, device: str, architecture: str) -> bool:
    """Whether `--quantization` (None: auto) will keep this model's weights quantized with
    `--dtype auto`: a Llama-family model, the native quantized GEMM on this CPU (any ISA
    variant that has it), and a GGUF source or an explicit w8a16 / int8 / gguf. The model
    runner asks before it picks the dtype (the quantized GEMM takes bf16 activations)."""
    if device != "cpu" or requested == "unquant" or architecture not in QUANT_ARCHITECTURES:
        return False
    native = load_native_kernels()
    if native is None or not native.has_quant_gemm:
        return False
    return requested is not None or gguf_source(folder) is not None


def resolve_quantization(
    requested: str | None,
    folder: str,
    device: str,
    dtype: torch.dtype,
    native: object,
    architecture: str = "LlamaForCausalLM",
) -> str:
    """The quantization this model runs with, or a precise refusal.

    None (auto): gguf for a Llama-family model converted from a GGUF where the native quantized
    GEMM runs (CPU, bf16, a kernel variant that has it: AVX512-BF16, AVX-512F, AVX2, NEON),
    else unquant (the dequantized path)."""
    arch_ok = architecture in QUANT_ARCHITECTURES
    has_gemm = native is not None and bool(getattr(native, "has_quant_gemm", False))
    kernels_ok = device == "cpu" and dtype == torch.bfloat16 and has_gemm
    if requested is None:
        auto = kernels_ok and arch_ok and gguf_source(folder) is not None
        return "gguf" if auto else "unquant"
    if requested == "unquant":
        return requested
    if not arch_ok:
        raise InvalidRequestError(
            f"--quantization {requested} serves {', '.join(QUANT_ARCHITECTURES)} models; "
            f"{architecture} runs dequantized (--quantization unquant)",
            "quantization",
        )
    if not kernels_ok:
        raise InvalidRequestError(
            f"--quantization {requested} needs the native CPU kernels' quantized GEMM (AVX2, "
            "AVX-512 or NEON) and bfloat16 activations (here: device "
            f"{device}, dtype {str(dtype).removeprefix('torch.')}, quantized GEMM "
            f"{'available' if has_gemm else 'unavailable'}); use --quantization unquant",
            "quantization",
        )
    if requested == "gguf" and gguf_source(folder) is None:
        raise InvalidRequestError(
            "--quantization gguf needs a .gguf model file (this model is a Hugging Face folder; "
            "--quantization w8a16 quantizes it to int8 at load)",
            "quantization",
        )
    return requested


def release_freed_memory() -> None:
    """Collect, then return the C heap's free pages to the OS (glibc `malloc_trim`): freed dense
    weights and load-time temporaries otherwise stay in the process's RSS."""
    import gc

    gc.collect()
    return_free_heap_to_os()


def _unpermute_order(rows: int, n_heads: int) -> np.ndarray:
    """Row order undoing llama.cpp's rope permutation (as gguf_convert._unpermute)."""
    order: np.ndarray = (
        np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).swapaxes(1, 2).reshape(-1)
    )
    return order


def read_gguf(
    path: Path, num_heads: int, num_kv_heads: int, permuted: bool
) -> tuple[dict[str, QuantPlanes], dict[str, torch.Tensor]]:
    """(HF name -> planes of kept 2-D tensors, HF name -> float32 tensor of the others)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    planes: dict[str, QuantPlanes] = {}
    dense: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name == _ROPE_FREQS:
            continue
        name = _hf_name(t.name)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        qtype = int(t.tensor_type)
        heads = num_heads if "q_proj" in name else num_kv_heads if "k_proj" in name else 0
        if qtype in KEPT_TYPES and len(shape) == 2 and shape[1] % 32 == 0:
            p = split_blocks(np.asarray(t.data), qtype, shape[0], shape[1])
            if permuted and heads:
                p = p.take_rows(_unpermute_order(shape[0], heads))
            planes[name] = p
            continue
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if permuted and heads:
            arr = arr[_unpermute_order(shape[0], heads)]
        dense[name] = torch.from_numpy(np.ascontiguousarray(arr))
    return planes, dense


# NOTE: safetensors inside, but not named *.safetensors: the folder's checkpoint is every such file
QUANT_CACHE = "radixgen_quant_v2.packed"  # bump with gemm_quant.c's packed layout


def _pack(native: NativeKernels, p: QuantPlanes) -> QuantLinearWeight:
    m = None if p.m is None else torch.from_numpy(p.m)
    return native.pack_quant(torch.from_numpy(p.q), torch.from_numpy(p.d), m, p.fmt)


def load_gguf_quantized(
    model: CausalLM, path: Path, native: NativeKernels, folder: str | Path
) -> None:
    """Fill `model` from the GGUF, its kept tensors packed for the quantized GEMM. The packed
    form is cached in the converted folder (reading the GGUF's metadata alone takes ~10 s)."""
    cache = Path(folder) / QUANT_CACHE
    loaded = _read_cache(cache) if cache.exists() else None
    if loaded is None:
        packed, dense = _pack_gguf(model, path, native)
        _write_cache(cache, packed, dense)
    else:
        packed, dense = loaded
    absent = set()
    for name in packed:
        absent |= _checkpoint_names(name)
    model.load_weights(iter(dense.items()), absent=absent)
    attach_quantized(model, native, packed)


def _pack_gguf(
    model: CausalLM, path: Path, native: NativeKernels
) -> tuple[dict[str, QuantLinearWeight], dict[str, torch.Tensor]]:
    cfg = model.cfg
    permuted = cfg.architecture in ("LlamaForCausalLM", "MistralForCausalLM")
    planes, dense = read_gguf(path, cfg.num_heads, cfg.num_kv_heads, permuted)
    quant: dict[str, QuantPlanes] = {}
    for i in range(cfg.num_layers):
        for fused, parts in _FUSED.items():
            names = [f"model.layers.{i}.{part}.weight" for part in parts]
            got = [planes.pop(n) for n in names if n in planes]
            if len(got) == len(names) and len({p.fmt for p in got}) == 1:
                quant[f"model.layers.{i}.{fused}.weight"] = concat_rows(got)
                continue
            for n, p in zip(names, got, strict=False):  # mixed formats: dequantized instead
                dense[n] = torch.from_numpy(p.dequantize())
    quant.update(planes)  # o_proj, down_proj, the embedding and an untied head
    return {name: _pack(native, p) for name, p in quant.items()}, dense


def _read_cache(
    path: Path,
) -> tuple[dict[str, QuantLinearWeight], dict[str, torch.Tensor]] | None:
    from safetensors import safe_open

    packed: dict[str, QuantLinearWeight] = {}
    dense: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as st:
            shapes = json.loads((st.metadata() or {})["radixgen_quant"])
            for name in st.keys():  # noqa: SIM118 - safe_open is not a dict
                if name in shapes:
                    fmt, n, k = shapes[name]
                    packed[name] = QuantLinearWeight(st.get_tensor(name), n, k, fmt, None)
                else:
                    dense[name] = st.get_tensor(name)
    except (OSError, ValueError, KeyError, RuntimeError):
        return None  # unreadable: rebuilt from the GGUF
    return packed, dense


def _write_cache(
    path: Path, packed: dict[str, QuantLinearWeight], dense: dict[str, torch.Tensor]
) -> None:
    """Atomic (a temporary file renamed into place); a cache that cannot be written is skipped."""
    import os

    from safetensors.torch import save_file

    shapes = {n: (w.fmt, w.out_features, w.in_features) for n, w in packed.items()}
    tensors = {**{n: w.data for n, w in packed.items()}, **dense}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={"radixgen_quant": json.dumps(shapes)})
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


# projections whose input is a pre-norm decoder layer's RMSNorm output (act_quant "mixed")
_READS_NORM = frozenset(
    {"qkv_proj", "q_proj", "k_proj", "v_proj", "gate_up_proj", "gate_proj", "up_proj"}
)


def _checkpoint_names(fused_name: str) -> set[str]:
    """The HF names a (possibly fused) parameter name stands for."""
    for fused, parts in _FUSED.items():
        if f".{fused}." in fused_name:
            return {fused_name.replace(fused, part) for part in parts}
    return {fused_name}


def attach_quantized(
    model: CausalLM, native: NativeKernels, packed: dict[str, QuantLinearWeight]
) -> None:
    """Put each packed weight on its module (with the module's bias) and drop the module's dense
    parameter."""
    from dataclasses import replace

    modules = dict(model.named_modules())
    for name, w in packed.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            model.set_quantized_embedding(name, w, native)
            continue
        mod = modules[name[len("model.") : -len(".weight")]]
        assert isinstance(mod, Linear), name
        bias = None if mod.bias is None else mod.bias.detach().float().contiguous()
        reads_norm = name.split(".")[-2] in _READS_NORM
        mod.set_quantized(replace(w, bias=bias, reads_norm=reads_norm), native)


def quantize_int8(model: CausalLM, native: NativeKernels) -> None:
    """w8a16: every dense linear weight (and the embedding / head) to int8 per channel."""
    quant: dict[str, QuantPlanes] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Linear) and mod.weight.shape[1] % 32 == 0:
            quant[f"model.{name}.weight"] = quantize_int8_per_channel(mod.weight.float().numpy())
    heads = [("model.embed_tokens.weight", model.embed_tokens.weight)]
    if not model.cfg.tie_word_embeddings:
        heads.append(("lm_head.weight", model.lm_head))
    for name, w in heads:
        if w.shape[1] % 32 == 0:
            quant[name] = quantize_int8_per_channel(w.float().numpy())
    attach_quantized(model, native, {name: _pack(native, p) for name, p in quant.items()})
