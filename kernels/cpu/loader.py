"""The native-or-torch decision for the CPU kernels, made once by the model runner (scheduler
process): pick the instruction-set variant (isa.py), load (building on first use) and bind its
library, or say why not."""

from __future__ import annotations

import logging
import os
from functools import cache

import torch

from .bindings import ACT_QUANT_MODES, NativeKernels
from .build import NativeBuildError, open_library
from .cpu_features import has_amx_bf16
from .isa import chosen_isa, why_not_runnable

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXGEN_DISABLE_NATIVE"  # "1": always the torch path
REQUIRE_ENV = "RADIXGEN_REQUIRE_NATIVE"  # "1": a failed build is an error, not a fallback
# "0": oneDNN serves the linear layers (for comparisons); "1": the native GEMM serves them on AMX
# CPUs too (where oneDNN is the default); unset: native unless the CPU has AMX
GEMM_ENV = "RADIXGEN_NATIVE_GEMM"
NATIVE_DTYPES = (torch.float32, torch.bfloat16)
# "int8": the quantized GEMM quantizes activations to int8 per row per 32-k group (integer dot
# products; AVX2 Q4_0/Q4_1 today); "int8x2": int8 and the residual in int8 again (~16 bits);
# "mixed": int8x2 for projections that read an RMSNorm output, int8 for the others; "off":
# float32 activations, the exact dequantize-then-matmul; unset: ACT_QUANT_DEFAULT's
ACT_QUANT_ENV = "RADIXGEN_CPU_ACT_QUANT"
ACT_QUANT_DEFAULT: dict[str, str] = {}  # variant -> mode when the variable is unset ("off")


@cache
def load_kernels_for_isa(isa: str) -> NativeKernels:
    """Variant `isa`'s kernels (built on first use); NativeBuildError when this CPU cannot run
    it or it cannot be built or loaded."""
    reason = why_not_runnable(isa)
    if reason is not None:
        raise NativeBuildError(reason)
    return NativeKernels(open_library(isa), isa)


@cache
def load_native_kernels() -> NativeKernels | None:
    """The kernels of the variant this CPU runs best (or RADIXGEN_CPU_ISA's), or None: disabled
    (RADIXGEN_DISABLE_NATIVE=1, which wins), no variant for this CPU, or unavailable (no
    compiler, a compile or a load error); logged once. Under RADIXGEN_REQUIRE_NATIVE=1 anything
    but disabled raises NativeBuildError instead."""
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        isa, why = chosen_isa()
        if isa is None:
            raise NativeBuildError(why)
        kernels = load_kernels_for_isa(isa)
    except NativeBuildError as e:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise NativeBuildError(
                f"{REQUIRE_ENV}=1 but the native CPU kernels are unavailable: {e}"
            ) from e
        logger.warning("native CPU kernels unavailable, using the torch path: %s", str(e)[:2000])
        return None
    mode, mode_why = chosen_act_quant(isa)
    if mode != "off":
        kernels = kernels.with_act_quant(mode)
    logger.info(
        "native CPU kernels: variant %s (%s), activations %s (%s)",
        isa, why, kernels.act_quant_active, mode_why,
    )  # fmt: skip
    return kernels


def chosen_act_quant(isa: str) -> tuple[str, str]:
    """(the activation mode for variant `isa`, and why): RADIXGEN_CPU_ACT_QUANT's, else the
    variant's default; an unknown value is logged and ignored."""
    forced = os.environ.get(ACT_QUANT_ENV)
    if forced in ACT_QUANT_MODES:
        return forced, f"{ACT_QUANT_ENV}={forced}"
    if forced:
        logger.warning("%s=%r is not one of %s: ignored", ACT_QUANT_ENV, forced, ACT_QUANT_MODES)
    return ACT_QUANT_DEFAULT.get(isa, "off"), f"the default for {isa}"


def select_native_kernels(device: str, dtype: torch.dtype) -> NativeKernels | None:
    """The kernels a model on `device` in `dtype` should use, or None for the torch path: they
    serve CPU models in float32 or bfloat16 (they have no float16 code)."""
    if device != "cpu" or dtype not in NATIVE_DTYPES:
        return None
    return load_native_kernels()


def select_linear_gemm(native: NativeKernels | None) -> NativeKernels | None:
    """`native` when its bf16 GEMM should serve the dense linear layers, else None (oneDNN): it
    needs AVX512-BF16, loses to oneDNN's tile path on AMX CPUs for large batches (unless
    RADIXGEN_NATIVE_GEMM=1), and RADIXGEN_NATIVE_GEMM=0 turns it off."""
    if native is None or not native.has_bf16_gemm:
        return None
    choice = os.environ.get(GEMM_ENV)
    if choice == "0" or (choice != "1" and has_amx_bf16()):
        return None
    return native
