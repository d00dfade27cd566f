"""Native CPU kernels: C sources compiled once with the host's C compiler, cached per machine,
and called through ctypes.

- `cpu_features`: this CPU's flags (AMX, AVX512-BF16), read once.
- `build`: compiler lookup, the cache key, compiling and installing the shared object.
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
from .loader import load_native_kernels, select_linear_gemm, select_native_kernels

__all__ = [
    "NativeBuildError",
    "NativeKernels",
    "PackedLinearWeight",
    "QuantLinearWeight",
    "cpu_flags",
    "has_amx_bf16",
    "has_fast_bf16",
    "load_native_kernels",
    "select_linear_gemm",
    "select_native_kernels",
]
