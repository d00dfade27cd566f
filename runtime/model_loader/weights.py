"""Read a model folder's safetensors into our model (scheduler process).

Tensors are copied straight from the memory-mapped files into parameters that were allocated
once in the target dtype, so a bf16 load converts each fp32 value exactly once and touches no
throw-away copy of the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_loader import quant_loader
from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.models.registry import model_class

if TYPE_CHECKING:
    from radixgen.kernels.cpu import NativeKernels
    from radixgen.kernels.layer_ops import FusedLayerOps


def weight_files(folder: str | Path) -> list[Path]:
    """The folder's *.safetensors files; with an index json, exactly the files it names."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [n for n in names if not (folder / n).exists()]
        if missing:
            raise InvalidRequestError(
                f"{folder}: shards named in {index.name} are missing: {missing}", "model_path"
            )
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidRequestError(f"no *.safetensors weights in {folder}", "model_path")
    return files


def iter_weights(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in its stored dtype) for every tensor of the checkpoint."""
    from safetensors import safe_open

    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, st.get_tensor(name)


def load_model(
    folder: str | Path,
    cfg: ModelArchConfig,
    dtype: torch.dtype,
    device: str | torch.device,
    max_positions: int,
    native: FusedLayerOps | None = None,
    gemm: NativeKernels | None = None,
    quantization: str = "unquant",
    kernels: NativeKernels | None = None,
    wide_rows: int | None = None,
) -> CausalLM:
    """Build the model uninitialised in `dtype` and fill it from the folder's checkpoint.

    native, gemm: the model runner's kernel choice (native: the fused layer ops, CPU or
    Triton), handed to `CausalLM.prepack`. The class follows the architecture
    (registry.py). quantization: as `resolve_quantization` decided (gguf: read from the source
    GGUF; w8a16 / int8: quantized after loading), with the native `kernels` serving the
    quantized weights. wide_rows: steps of this many rows take bf16 copies of the linear
    layers on oneDNN (`CausalLM.prepack`; None: never)."""
    model: CausalLM = model_class(cfg).create(cfg, dtype, device, max_positions)
    source = quant_loader.gguf_source(folder) if quantization == "gguf" else None
    if source is not None:
        assert kernels is not None
        quant_loader.load_gguf_quantized(model, source, kernels, folder)
    else:
        model.load_weights(iter_weights(folder))
        if quantization in ("w8a16", "int8"):
            assert kernels is not None
            quant_loader.quantize_int8(model, kernels)
    model.prepack(native, gemm, wide_rows)
    quant_loader.release_freed_memory()  # the dense copies are gone: give their pages back
    return model
