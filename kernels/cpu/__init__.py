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
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCES = ["ragged_attention.c", "fused_ops.c", "gemm_bf16.c"]
_HEADERS = ["cpu_common.h"]
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=fast"]
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


@dataclass(frozen=True)
class PackedLinearWeight:
    """A bf16 linear weight laid out for `gemm_bf16` (gemm_bf16.c), with its bias in float32."""

    data: torch.Tensor
    out_features: int
    in_features: int
    bias: torch.Tensor | None


class NativeKernels:
    """Typed Python entry points over the compiled library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        fn = lib.ragged_attention
        fn.restype = ctypes.c_int
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        fn.argtypes = [p, i64, p, p, p, p, p, p, i32, p, i32, i32, i32, ctypes.c_float, i32, i64]
        self._ragged = fn
        f32 = ctypes.c_float
        self._add_rmsnorm = lib.add_rmsnorm
        self._add_rmsnorm.restype = None
        self._add_rmsnorm.argtypes = [p, p, p, p, i64, i64, f32, i32, i32]
        self._rope = lib.rope_store_kv
        self._rope.restype = None
        self._rope.argtypes = [p, i64, p, p, p, p, p, p, p, i64, i32, i32, i32, i32, i32]
        self._silu_mul = lib.silu_mul
        self._silu_mul.restype = None
        self._silu_mul.argtypes = [p, p, i64, i64, i32, i32]
        self._greedy = lib.greedy_refine_bf16
        self._greedy.restype = None
        self._greedy.argtypes = [p, i64, p, p, p, i64, i64, i64, p, i64, p]
        self._refine = lib.refine_near_max_f32
        self._refine.restype = None
        self._refine.argtypes = [p, i64, p, i64, p, i64, i64, i64]
        self._gemm_elems = lib.gemm_bf16_packed_elems
        self._gemm_elems.restype = i64
        self._gemm_elems.argtypes = [i64, i64]
        self._gemm_pack = lib.gemm_bf16_pack
        self._gemm_pack.restype = None
        self._gemm_pack.argtypes = [p, i64, i64, p]
        self._gemm = lib.gemm_bf16
        self._gemm.restype = ctypes.c_int
        self._gemm.argtypes = [p, i64, i64, p, i64, i64, p, p, i64, i32]
        self.has_bf16_gemm = bool(lib.gemm_bf16_available())

    # --- linear layers (see gemm_bf16.c) ----------------------------------------------------

    def pack_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> PackedLinearWeight:
        """Pack a bf16 [out, in] weight (and its bias) once, at load time."""
        assert self.has_bf16_gemm and weight.dtype == torch.bfloat16 and weight.dim() == 2
        weight = weight.detach().contiguous()
        n, k = weight.shape
        data = torch.empty(self._gemm_elems(n, k), dtype=torch.bfloat16)
        self._gemm_pack(weight.data_ptr(), n, k, data.data_ptr())
        b = None if bias is None else bias.detach().float().contiguous()
        return PackedLinearWeight(data, n, k, b)

    def linear_bf16(
        self, x: torch.Tensor, packed: PackedLinearWeight, out_dtype: torch.dtype = torch.bfloat16
    ) -> torch.Tensor:
        """x [M, in] bf16 -> x W^T + b as [M, out] bf16 (or float32, unrounded); a row's result
        never depends on M."""
        k = packed.in_features
        assert x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[1] == k
        if x.stride(1) != 1 or x.stride(0) < k:
            x = x.contiguous()
        if k % 2:  # the kernel reads k-pairs: give odd-length rows a zero column
            x = torch.nn.functional.pad(x, (0, 1))
        m = x.shape[0]
        assert out_dtype in (torch.bfloat16, torch.float32)
        y = torch.empty((m, packed.out_features), dtype=out_dtype)
        if m == 0:
            return y
        bias = 0 if packed.bias is None else packed.bias.data_ptr()
        rc = self._gemm(
            x.data_ptr(), m, x.stride(0), packed.data.data_ptr(), packed.out_features, k,
            bias, y.data_ptr(), packed.out_features, int(out_dtype == torch.float32),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"native gemm_bf16 failed with code {rc}")
        return y

    # --- logits (see fused_ops.c: exact re-scoring of bf16 near-ties) -------------------------

    def greedy_refine(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        rows: list[int],
        vocab: int,
        bitmask: torch.Tensor | None = None,
    ) -> list[int]:
        """Argmax token of each given bf16 logits row, near-max candidates re-scored exactly.

        bitmask: None, or int32 [len(rows), W] packed grammar masks (row r for rows[r]): the
        argmax is then over the allowed tokens only.
        """
        assert logits.dtype == hidden.dtype == weight.dtype == torch.bfloat16
        assert logits.stride(1) == 1 and hidden.is_contiguous() and weight.is_contiguous()
        idx = torch.tensor(rows, dtype=torch.long)
        out = torch.empty(len(rows), dtype=torch.long)
        masks, words = 0, 0
        if bitmask is not None:
            assert bitmask.dtype == torch.int32 and bitmask.shape[0] == len(rows)
            bitmask = bitmask.contiguous()
            masks, words = bitmask.data_ptr(), bitmask.shape[1]
        self._greedy(
            logits.data_ptr(), logits.stride(0), hidden.data_ptr(), weight.data_ptr(),
            idx.data_ptr(), len(rows), vocab, hidden.shape[1], masks, words, out.data_ptr(),
        )  # fmt: skip
        return out.tolist()

    def refine_near_max(
        self, logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor
    ) -> None:
        """In place on float32 rows converted from bf16 logits; hidden: the same rows' states."""
        assert logits.dtype == torch.float32 and logits.stride(1) == 1 and hidden.stride(1) == 1
        assert hidden.dtype == weight.dtype == torch.bfloat16 and weight.is_contiguous()
        r, v = logits.shape
        self._refine(
            logits.data_ptr(), logits.stride(0), hidden.data_ptr(), hidden.stride(0),
            weight.data_ptr(), r, v, hidden.shape[1],
        )  # fmt: skip

    # --- fused layer ops (see fused_ops.c) --------------------------------------------------

    def add_rmsnorm(
        self, x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x (in place, float32); returns norm(residual) * weight in weight's dtype.

        x: weight's dtype, or float32 (a projection left unrounded for the residual stream)."""
        n, h = residual.shape
        assert residual.dtype == torch.float32 and residual.is_contiguous()
        assert x is None or (x.is_contiguous() and x.dtype in (weight.dtype, torch.float32))
        out = torch.empty((n, h), dtype=weight.dtype)
        self._add_rmsnorm(
            0 if x is None else x.data_ptr(), residual.data_ptr(), weight.data_ptr(),
            out.data_ptr(), n, h, float(eps), _DTYPE_CODES[weight.dtype],
            _DTYPE_CODES[weight.dtype if x is None else x.dtype],
        )  # fmt: skip
        return out

    def rope_store_kv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        out_cache_loc: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> torch.Tensor:
        """Rotated q [N, H, D]; rotated k and v written into the pools at `out_cache_loc`.

        q and the pools have the pools' dtype; float32 qkv (an unrounded projection) under bf16
        pools is rotated in float32 and rounded once."""
        n = qkv.shape[0]
        assert (
            qkv.stride(1) == 1
            and positions.dtype == torch.long
            and out_cache_loc.dtype == torch.long
        )
        assert cos.dtype == torch.float32 and cos.is_contiguous() and k_pool.is_contiguous()
        assert qkv.dtype in (k_pool.dtype, torch.float32) and v_pool.dtype == k_pool.dtype
        q = torch.empty((n, num_heads, head_dim), dtype=k_pool.dtype)
        self._rope(
            qkv.data_ptr(), qkv.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), out_cache_loc.data_ptr(), n,
            num_heads, num_kv_heads, head_dim, _DTYPE_CODES[k_pool.dtype], _DTYPE_CODES[qkv.dtype],
        )  # fmt: skip
        return q

    def silu_mul(self, gate_up: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """silu(gate) * up for gate_up = [gate | up] rows, in out_dtype (default: gate_up's);
        float32 in and bf16 out rounds the product once."""
        n, two_i = gate_up.shape
        assert gate_up.is_contiguous()
        out_dtype = out_dtype or gate_up.dtype
        out = torch.empty((n, two_i // 2), dtype=out_dtype)
        self._silu_mul(
            gate_up.data_ptr(), out.data_ptr(), n, two_i // 2, _DTYPE_CODES[out_dtype],
            _DTYPE_CODES[gate_up.dtype],
        )  # fmt: skip
        return out

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


@cache
def _cpu_flags_line() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    return frozenset(_cpu_flags_line().partition(":")[2].split())


def _cpu_signature() -> str:
    return _cpu_flags_line() or os.uname().machine


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
    for s in [*sources, *(here / name for name in _HEADERS)]:
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
