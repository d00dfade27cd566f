"""Native CPU kernels: C sources compiled once with the host's gcc, cached, and called through ctypes.

The shared object is built with OpenMP and links the same `libgomp.so.1` that torch has already
loaded, so kernels share torch's thread pool and thread count. If no compiler is available (or
RADIXGEN_DISABLE_NATIVE=1) `load_native_kernels()` returns None and callers use the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCES = ["decode_attention.c"]
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=fast"]
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


class NativeKernels:
    """Typed Python entry points over the compiled library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        fn = lib.decode_attention
        fn.restype = ctypes.c_int
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_float,
            ctypes.c_int,
            ctypes.c_int64,
        ]
        self._decode = fn

    def decode_attention(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        max_len: int | None = None,
    ) -> None:
        """q: [B, H, D] (rows may be strided), k/v_buf: [S, Hkv, D], out: [B, H, D] contiguous."""
        b, h, d = q.shape
        hkv = k_buf.shape[1]
        assert q.stride(2) == 1 and q.stride(1) == d and out.is_contiguous()
        assert k_buf.is_contiguous() and v_buf.is_contiguous() and q.dtype == k_buf.dtype
        assert kv_indices.dtype == torch.long and kv_indptr.dtype == torch.long
        if max_len is None:
            max_len = int((kv_indptr[1:] - kv_indptr[:-1]).max()) if b else 0
        rc = self._decode(
            q.data_ptr(),
            q.stride(0),
            k_buf.data_ptr(),
            v_buf.data_ptr(),
            kv_indices.data_ptr(),
            kv_indptr.data_ptr(),
            out.data_ptr(),
            b,
            h,
            hkv,
            d,
            float(scale),
            _DTYPE_CODES[q.dtype],
            max_len,
        )
        if rc != 0:
            raise RuntimeError(
                f"native decode_attention failed with code {rc} (shape {tuple(q.shape)})"
            )


def _cache_dir() -> Path:
    root = os.environ.get("RADIXGEN_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "radixgen") / "kernels"


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build(sources: list[Path], out: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler found (gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [cc, *_CFLAGS, *map(str, sources), "-o", str(tmp_out), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(tmp_out, out)


@cache
def load_native_kernels() -> NativeKernels | None:
    """Compile (once per source and CPU) and load the native kernels, or None if unavailable."""
    if os.environ.get("RADIXGEN_DISABLE_NATIVE") == "1":
        return None
    here = Path(__file__).parent
    sources = [here / s for s in _SOURCES]
    h = hashlib.sha256()
    for s in sources:
        h.update(s.read_bytes())
    h.update(" ".join(_CFLAGS).encode())
    h.update(_cpu_signature().encode())
    lib_path = _cache_dir() / f"radixgen_cpu_{h.hexdigest()[:16]}.so"
    try:
        if not lib_path.exists():
            _build(sources, lib_path)
        return NativeKernels(ctypes.CDLL(str(lib_path)))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        logger.warning("native CPU kernels unavailable, using the torch path: %s", detail[:500])
        return None
