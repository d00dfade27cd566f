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

_SOURCES = ["ragged_attention.c"]
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=fast"]
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


class NativeKernels:
    """Typed Python entry points over the compiled library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        fn = lib.ragged_attention
        fn.restype = ctypes.c_int
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        fn.argtypes = [p, i64, p, p, p, p, p, p, i32, p, i32, i32, i32, ctypes.c_float, i32, i64]
        self._ragged = fn

    def ragged_attention(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        q_indptr: torch.Tensor,
        q_pos0: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        window: int | None = None,
    ) -> None:
        """Causal attention of a ragged batch (see ragged_attention.c for the layout).

        q: [N, H, D] (rows may be strided), k/v_buf: [S, Hkv, D], out: [N, H, D] contiguous;
        request r's query rows are q_indptr[r]:q_indptr[r+1], the first at position q_pos0[r],
        and its keys' slots are kv_indices[kv_indptr[r]:kv_indptr[r+1]] by position.
        """
        _, h, d = q.shape
        assert q.stride(2) == 1 and q.stride(1) == d and out.is_contiguous()
        assert k_buf.is_contiguous() and v_buf.is_contiguous() and q.dtype == k_buf.dtype
        for t in (kv_indices, kv_indptr, q_indptr, q_pos0):
            assert t.dtype == torch.long and t.is_contiguous()
        rc = self._ragged(
            q.data_ptr(),
            q.stride(0),
            k_buf.data_ptr(),
            v_buf.data_ptr(),
            kv_indices.data_ptr(),
            kv_indptr.data_ptr(),
            q_indptr.data_ptr(),
            q_pos0.data_ptr(),
            q_indptr.numel() - 1,
            out.data_ptr(),
            h,
            k_buf.shape[1],
            d,
            float(scale),
            _DTYPE_CODES[q.dtype],
            window or 0,
        )
        if rc != 0:
            raise RuntimeError(
                f"native ragged_attention failed with code {rc} (shape {tuple(q.shape)})"
            )

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
        """One query per request, at the last of its listed keys."""
        b = q.shape[0]
        lens = kv_indptr[1:] - kv_indptr[:-1]
        self.ragged_attention(
            q,
            k_buf,
            v_buf,
            kv_indices,
            kv_indptr,
            torch.arange(b + 1, dtype=torch.long),
            lens - 1,
            out,
            scale,
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
