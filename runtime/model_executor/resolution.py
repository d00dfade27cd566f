"""The runner's one-time choices: device, dtype, attention backend, the native or torch kernels,
the linear layers' GEMM, the fused layer ops and the quantization (scheduler process).

Decided once, before the model loads, from the flags, the model's config and this machine
(CUDA visible, CPU features, the environment), and handed down: no module re-decides them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.errors import InvalidRequestError
from radixgen.kernels.cpu import (
    NativeKernels,
    has_fast_bf16,
    select_linear_gemm,
    select_native_kernels,
    select_wide_rows,
)
from radixgen.kernels.layer_ops import FusedLayerOps, select_gpu_fused_ops
from radixgen.runtime.model_loader.quant_loader import keeps_quantized, resolve_quantization
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.distributed.parallel_state import TensorParallelGroup

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16 makes bf16 matmuls fast on this CPU."""
    return has_fast_bf16()


def resolve_device(device: str) -> str:
    """`--device`: auto picks CUDA when a device is visible; cuda without one is refused."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise InvalidRequestError(
            f"--device cuda: no CUDA device is visible (torch {torch.__version__} is {build}); "
            "use --device cpu or auto",
            "device",
        )
    return device


# head dims flashinfer's attention modules are built for (its JIT compiles each on first use)
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def flashinfer_serves(cfg: ModelArchConfig | None, dtype: torch.dtype | None) -> bool:
    """Whether the flashinfer backend can run this model: bf16 or fp16, a head dim it has, and
    no sliding-window layers (None: not known yet, assumed so)."""
    if dtype not in (None, torch.bfloat16, torch.float16):
        return False
    return cfg is None or (
        cfg.head_dim in FLASHINFER_HEAD_DIMS and all(w is None for w in cfg.layer_sliding_windows)
    )


def resolve_attention_backend(
    name: str,
    device: str,
    cfg: ModelArchConfig | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """The backend `--attention-backend` names on `device`, or a precise refusal.

    On CPU only torch runs natively; triton there needs Triton's interpreter (TRITON_INTERPRET=1,
    for the kernels' tests: it is thousands of times slower). `auto` on CUDA: flashinfer where it
    imports and serves the model (bf16 or fp16, a head dim it has, no sliding-window layers),
    else triton. Models that soft-cap attention logits (Gemma 2) run on torch or triton: `auto`
    picks triton on CUDA, and flashinfer is refused.
    """
    softcap = cfg is not None and cfg.attn_logit_softcapping is not None
    if softcap and name == "flashinfer":
        raise InvalidRequestError(
            "--attention-backend flashinfer has no attention logit soft-capping, which "
            f"{cfg.architecture if cfg else 'this model'} needs (use triton, torch or auto)",
            "attention_backend",
        )
    if name == "auto":
        if device == "cpu":
            return "torch"
        if softcap:
            return "triton"
        from importlib.util import find_spec

        serves = flashinfer_serves(cfg, dtype)
        return "flashinfer" if serves and find_spec("flashinfer") is not None else "triton"
    if (
        device == "cpu"
        and name == "triton"
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    ):
        raise InvalidRequestError(
            "--attention-backend triton needs a CUDA device (on CPU: torch; TRITON_INTERPRET=1 "
            "runs the Triton kernels interpreted, for tests only)",
            "attention_backend",
        )
    if device == "cpu" and name == "flashinfer":
        raise InvalidRequestError(
            "--attention-backend flashinfer needs a CUDA device (on CPU: torch)",
            "attention_backend",
        )
    return name


def resolve_dtype(dtype: str, device: str, kept_quantized: bool = False) -> torch.dtype:
    """`--dtype`: auto is bf16 on CUDA, on CPUs that multiply bf16 fast (AVX512-BF16, AMX),
    and wherever the weights are kept quantized (the native quantized GEMM takes bf16
    activations and accumulates in float32 on every ISA: AVX2 and AVX-512F too); else
    float32 (MKL's GEMM on dequantized weights)."""
    if dtype == "auto":
        if device.startswith("cuda") or cpu_has_bf16() or kept_quantized:
            return torch.bfloat16
        return torch.float32
    return _DTYPES[dtype]


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class RunnerChoices:
    """What `resolve_runner` decided for one runner."""

    cfg: ModelArchConfig  # the model's architecture
    device: str
    dtype: torch.dtype
    attention_backend: str  # the backend's registry name
    # NOTE: the one native-or-torch decision (device, dtype, environment, CPU features): the
    # model, its linear layers, the attention backend and the logits are handed it
    native: NativeKernels | None
    linear_gemm: NativeKernels | None  # the GEMM the linear layers are packed for (None: oneDNN)
    # the decoder's fused layer ops: the native CPU kernels, else on CUDA the Triton ones (None:
    # torch ops); attention and logits keep `native` (CPU only)
    layer_ops: FusedLayerOps | None
    quantization: str  # as `resolve_quantization` decided ("unquant" under TP)
    # steps of this many rows run the linear layers from bf16 copies on oneDNN (opt-in, AMX)
    wide_rows: int | None = None


def resolve_runner(
    model_folder: str,
    args: ServerArgs,
    arch: ModelArchConfig | None = None,
    tp: TensorParallelGroup | None = None,
) -> RunnerChoices:
    """Every choice of a runner for the model in `model_folder` under `args`. `arch`: the
    folder's config when the caller has read it already (else read here); `tp`: this process's
    tensor-parallel rank, or None."""
    device = resolve_device(args.model.device)
    cfg = arch if arch is not None else ModelArchConfig.from_folder(model_folder)
    # NOTE: TP shards dense weights, so a GGUF runs dequantized there (ServerArgs refuses
    # any other --quantization with --tp-size > 1)
    kept = tp is None and keeps_quantized(
        args.model.quantization, model_folder, device, cfg.architecture
    )
    dtype = resolve_dtype(args.model.dtype, device, kept)
    backend = resolve_attention_backend(args.model.attention_backend, device, cfg, dtype)
    native = select_native_kernels(device, dtype)
    quantization = "unquant" if tp is not None else resolve_quantization(
        args.model.quantization, model_folder, device, dtype, native, cfg.architecture
    )  # fmt: skip
    # NOTE: TP shards the dense layers, which keep one packing (no copies for wide steps)
    wide_rows = None if tp is not None else select_wide_rows(native, quantization, dtype)
    gemm = select_linear_gemm(native, wide_rows)
    layer_ops = native if native is not None else select_gpu_fused_ops(device, dtype)
    return RunnerChoices(
        cfg, device, dtype, backend, native, gemm, layer_ops, quantization, wide_rows
    )
