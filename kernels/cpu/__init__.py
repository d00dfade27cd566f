"""Native CPU kernels: C sources compiled once with the host's C compiler, cached per machine,
and called through ctypes.

- `cpu_features`: this CPU's flags (AMX, AVX512-BF16), read once.
- `isa`: the instruction-set variants (AVX512-BF16, AVX-512, AVX2, NEON) the library is built
  in, each at a fixed -march level, and which of them this CPU runs (RADIXGEN_CPU_ISA forces
  one).
- `build`: compiler lookup, the cache key, compiling and installing each variant's library.
- `bindings`: the ABI table (mirrors radixgen_kernels.h) and the typed `NativeKernels`.
- `loader`: the native-or-torch decision the model runner makes once and passes down (None: the
  torch path, under RADIXGEN_DISABLE_NATIVE=1 or after a failed build, which
  RADIXGEN_REQUIRE_NATIVE=1 turns into an error).

The shared object is built with OpenMP and links the same `libgomp.so.1` that torch has already
loaded, so kernels share torch's thread pool and thread count.
"""

from .bindings import NativeKernels, PackedLinearWeight, QuantLinearWeight
from .build import NativeBuildError
from .cpu_features import cpu_flags, has_amx_bf16, has_fast_bf16
from .isa import runnable_isas
from .loader import (
    load_kernels_for_isa,
    load_native_kernels,
    select_linear_gemm,
    select_native_kernels,
    select_wide_rows,
)

__all__ = [
    "NativeBuildError",
    "NativeKernels",
    "PackedLinearWeight",
    "QuantLinearWeight",
    "cpu_flags",
    "has_amx_bf16",
    "has_fast_bf16",
    "load_kernels_for_isa",
    "load_native_kernels",
    "runnable_isas",
    "select_linear_gemm",
    "select_native_kernels",
    "select_wide_rows",
]
