"""The native-or-torch decision for the CPU kernels, made once by the model runner (scheduler
process): load (building on first use) and bind the library, or say why not."""

from __future__ import annotations

import logging
import os
from functools import cache

import torch

from .bindings import NativeKernels
from .build import NativeBuildError, open_library
from .cpu_features import has_amx_bf16

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXGEN_DISABLE_NATIVE"  # "1": always the torch path
REQUIRE_ENV = "RADIXGEN_REQUIRE_NATIVE"  # "1": a failed build is an error, not a fallback
GEMM_ENV = "RADIXGEN_NATIVE_GEMM"  # "0": oneDNN serves the linear layers (for comparisons)
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


@cache
def load_native_kernels() -> NativeKernels | None:
    """The compiled kernels, or None: disabled (RADIXGEN_DISABLE_NATIVE=1, which wins), or
    unavailable (no compiler, a compile or a load error; logged). Under
    RADIXGEN_REQUIRE_NATIVE=1 unavailable raises NativeBuildError instead."""
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        return NativeKernels(open_library())
    except NativeBuildError as e:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise NativeBuildError(
                f"{REQUIRE_ENV}=1 but the native CPU kernels are unavailable: {e}"
            ) from e
        logger.warning("native CPU kernels unavailable, using the torch path: %s", str(e)[:2000])
        return None


def select_native_kernels(device: str, dtype: torch.dtype) -> NativeKernels | None:
    """The kernels a model on `device` in `dtype` should use, or None for the torch path: they
    serve CPU models in float32 or bfloat16 (they have no float16 code)."""
    if device != "cpu" or dtype not in NATIVE_DTYPES:
        return None
    return load_native_kernels()


def select_linear_gemm(native: NativeKernels | None) -> NativeKernels | None:
    """`native` when its bf16 GEMM should serve the linear layers, else None (oneDNN): it needs
    AVX512-BF16, loses to oneDNN's tile path on AMX CPUs, and RADIXGEN_NATIVE_GEMM=0 turns it
    off."""
    if native is None or not native.has_bf16_gemm or has_amx_bf16():
        return None
    return None if os.environ.get(GEMM_ENV, "1") == "0" else native
