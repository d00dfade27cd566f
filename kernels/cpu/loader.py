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
# A model may also keep a bf16 copy of its linear layers (kept quantized, or packed for the
# native bf16 GEMM) for steps of at least N rows, which oneDNN multiplies (on AMX CPUs on the
# tile unit: 1.9-2.8x the decode throughput of 32-64 requests of the quantized default model on
# a 2-core Sapphire Rapids). Opt-in, as a row's result then
# depends on its step's size: "N" rows, "auto" the AMX defaults below on AMX CPUs (else never),
# unset or "0" never
WIDE_ROWS_ENV = "RADIXGEN_AMX_WIDE_ROWS"
# "auto"'s rows on AMX, from the crossovers measured on a 2-core Sapphire Rapids: the quantized
# GEMM against the copies 1.15x at 8 rows, 0.87x at 12; the native bf16 GEMM against oneDNN
# 1.5x at 1 row, 1.0x at 4, 0.92x at 6
AMX_WIDE_ROWS_DEFAULT = 12  # weights kept quantized
AMX_WIDE_ROWS_DENSE_DEFAULT = 4  # a bf16 model (the native bf16 GEMM below)
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


def select_linear_gemm(
    native: NativeKernels | None, wide_rows: int | None = None
) -> NativeKernels | None:
    """`native` when its bf16 GEMM should serve the dense linear layers, else None (oneDNN): it
    needs AVX512-BF16, loses to oneDNN's tile path on AMX CPUs for large batches (unless
    RADIXGEN_NATIVE_GEMM=1, or `wide_rows` says bf16 copies serve those on oneDNN), and
    RADIXGEN_NATIVE_GEMM=0 turns it off."""
    if native is None or not native.has_bf16_gemm:
        return None
    choice = os.environ.get(GEMM_ENV)
    if choice == "0" or (choice != "1" and wide_rows is None and has_amx_bf16()):
        return None
    return native


def select_wide_rows(
    native: NativeKernels | None, quantization: str, dtype: torch.dtype = torch.bfloat16
) -> int | None:
    """The step rows from which a model runs its linear layers and head from bf16 copies
    through oneDNN, or None for never (RADIXGEN_AMX_WIDE_ROWS: unset or "0" never, "N" rows,
    "auto" AMX_WIDE_ROWS_DEFAULT (a bf16 model: AMX_WIDE_ROWS_DENSE_DEFAULT) where the CPU has
    AMX-BF16, whose tile unit multiplies bf16 several times faster than the native GEMMs'
    vector code once a step has many rows). The
    smaller steps keep the native kernels: the quantized GEMM for weights kept quantized
    (`quantization` not "unquant"), the native bf16 GEMM (AVX512-BF16, not turned off by
    RADIXGEN_NATIVE_GEMM=0) for a bf16 model. Not the default: the rows of a step then differ
    from the same rows in a smaller step, so greedy outputs depend on the batch (speculation,
    overlap and retraction stop giving identical outputs)."""
    if native is None:
        return None
    if quantization == "unquant" and (
        dtype != torch.bfloat16 or not native.has_bf16_gemm or os.environ.get(GEMM_ENV) == "0"
    ):
        return None
    auto = AMX_WIDE_ROWS_DENSE_DEFAULT if quantization == "unquant" else AMX_WIDE_ROWS_DEFAULT
    choice = os.environ.get(WIDE_ROWS_ENV)
    if choice is None:
        if has_amx_bf16():
            logger.info(
                "this CPU has AMX: %s=auto would run steps of %d+ rows from bf16 copies of the "
                "linear layers on the tile unit (faster batches and prefill; rows then depend "
                "on the batch)", WIDE_ROWS_ENV, auto,
            )  # fmt: skip
        return None
    if choice == "auto":
        return auto if has_amx_bf16() else None
    try:
        rows = int(choice)
    except ValueError:
        logger.warning("%s=%r is not a number of rows or auto: ignored", WIDE_ROWS_ENV, choice)
        return None
    return rows if rows > 0 else None
