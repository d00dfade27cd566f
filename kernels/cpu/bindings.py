"""Typed Python entry points over the compiled library (ctypes), whose ABI is declared as data;
called from the scheduler process's model step.

`SIGNATURES` mirrors radixgen_kernels.h prototype by prototype (test/kernels/test_native_abi.py
checks both ways); the methods of `NativeKernels` check shapes and dtypes, then pass pointers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..step_cancel import CancelFlag, StepCancelled
from .build import NativeBuildError

CType = (
    type[ctypes.c_void_p]
    | type[ctypes.c_int64]
    | type[ctypes.c_int]
    | type[ctypes.c_float]
    | type[ctypes.c_double]
)

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
# decoder_stack_forward: layers, n_layers, dims, eps, scale, cos, sin, x, final_norm, rows, M,
# out, pos, loc, N, kv_indices, kv_indptr, q_indptr, q_pos0, R, work, cancel
_STACK_ARGS = (_P, _I32, _P, _F32, _F32, _P, _P, _P, _P, _P, _I64, _P, _P, _P, _I64, _P, _P, _P, _P, _I32, _P, _P)  # fmt: skip
DECODER_STACK_CANCELLED = 1000  # radixgen_kernels.h

# name -> (restype, argtypes) of every exported function; None is a void result.
SIGNATURES: dict[str, tuple[CType | None, tuple[CType, ...]]] = {
    "ragged_attention": (
        _I32,
        (
            _P,
            _I64,
            _P,
            _P,
            _P,
            _P,
            _P,
            _P,
            _I32,
            _P,
            _I32,
            _I32,
            _I32,
            _F32,
            _I32,
            _I64,
            _I32,
            _P,
            _P,
        ),
    ),
    "add_rmsnorm": (None, (_P, _P, _P, _P, _I64, _I64, _F32, _I32, _I32)),
    "rope_store_kv": (
        None,
        (_P, _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _I32, _I32, _I32, _I32, _I32, _I32, _P, _P),
    ),
    "silu_mul": (None, (_P, _P, _I64, _I64, _I32, _I32)),
    "greedy_refine_bf16": (None, (_P, _I64, _P, _P, _P, _I64, _I64, _I64, _P, _I64, _P)),
    "refine_near_max_f32": (None, (_P, _I64, _P, _I64, _P, _I64, _I64, _I64)),
    "argmax_f32": (None, (_P, _I64, _P, _I64, _I64, _P, _I64, _P)),
    "gemm_bf16_packed_elems": (_I64, (_I64, _I64)),
    "gemm_bf16_available": (_I32, ()),
    "gemm_bf16_pack": (None, (_P, _I64, _I64, _P)),
    "gemm_bf16": (_I32, (_P, _I64, _I64, _P, _I64, _I64, _P, _P, _I64, _I32)),
    "qgemm_packed_bytes": (_I64, (_I64, _I64, _I32)),
    "qgemm_available": (_I32, ()),
    "qgemm_pack": (None, (_P, _P, _P, _I64, _I64, _I32, _P)),
    "qgemm_rows_bf16": (None, (_P, _I64, _I64, _I32, _P, _I64, _P)),
    "qgemm_act_int8_formats": (_I32, ()),
    "qgemm": (_I32, (_P, _I64, _I64, _P, _I64, _I64, _I32, _P, _P, _I64, _I32)),
    "decoder_stack_words": (_I32, ()),
    "decoder_stack_workspace_bytes": (_I64, (_I64, _I64, _I32, _I32, _I32, _I64)),
    "decoder_stack_forward": (_I32, _STACK_ARGS),
    "team_threads": (_I32, ()),
    "team_report": (None, (_I32, ctypes.c_double, ctypes.c_double, ctypes.c_double)),
    "team_stats": (None, (_P,)),
    "team_reset": (None, ()),
}

QUANT_FORMATS = {"u4": 0, "i8": 1, "u4f": 2, "i8h": 3, "i8m": 4}  # gemm_quant.c's `fmt` codes
QUANT_GROUP = 32  # k per scale group
# or'ed into a `fmt` code: qgemm quantizes the activations to int8 per row per group ("int8",
# gemm_quant.c's QACT_I8), or to int8 and the residual to int8 again ("int8x2", QACT_I8X2),
# where the build has that path for the format (qgemm_act_int8_formats)
ACT_FLAGS = {"off": 0, "int8": 256, "int8x2": 512}
# "mixed": int8x2 for weights that read an RMSNorm output (QuantLinearWeight.reads_norm: their
# outlier channels cost one int8 too much accuracy), int8 for the others
ACT_QUANT_MODES = (*ACT_FLAGS, "mixed")  # NativeKernels.act_quant

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}  # the kernels' `dtype` arguments
# the KV pool formats of `kv_dtype` arguments (kv_quant.h)
KV_CODES = {**DTYPE_CODES, torch.int8: 2, torch.float8_e4m3fn: 3}
KVScales = tuple[torch.Tensor, torch.Tensor] | None


def _scale_ptrs(scales: KVScales, rows: int, heads: int) -> tuple[int, int]:
    """Pointers of float32 [rows, heads] K and V scales (0, 0 without)."""
    if scales is None:
        return 0, 0
    for t in scales:
        assert t.dtype == torch.float32 and t.is_contiguous() and t.shape == (rows, heads)
    return scales[0].data_ptr(), scales[1].data_ptr()


def _row_masks(bitmask: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """A packed grammar bitmask (int32 [rows, W], one row per logits row) laid out for the
    greedy kernels; None stays None (every token allowed)."""
    if bitmask is None:
        return None
    assert bitmask.dtype == torch.int32 and bitmask.shape[0] == rows
    return bitmask.contiguous()


def bind(lib: ctypes.CDLL, name: str) -> Callable[..., Any]:
    """`lib`'s function `name` with its types from SIGNATURES."""
    restype, argtypes = SIGNATURES[name]
    try:
        fn = lib[name]
    except AttributeError as e:
        raise NativeBuildError(f"the native library has no function {name!r}") from e
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


@dataclass(frozen=True)
class PackedLinearWeight:
    """A bf16 linear weight laid out for `gemm_bf16` (gemm_bf16.c), with its bias in float32."""

    data: torch.Tensor
    out_features: int
    in_features: int
    bias: torch.Tensor | None


@dataclass(frozen=True)
class QuantLinearWeight:
    """A weight kept quantized for `qgemm` (gemm_quant.c): w = d * q + m per group of 32 along
    k; fmt "u4" (q 0..15, float16 scale and min), "u4f" (the same with float32 ones), "i8"
    (q -128..127, float16 scale only), "i8h" (int8, a float32 scale per 16) or "i8m" (int8
    with float32 scale and min)."""

    data: torch.Tensor  # uint8, the packed layout
    out_features: int
    in_features: int
    fmt: str
    bias: torch.Tensor | None
    reads_norm: bool = False  # its input is an RMSNorm output (act_quant "mixed")

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())


@dataclass(frozen=True)
class TeamStats:
    """team.c's counters for one calling thread."""

    timed: int  # parallel regions of the whole team timed
    late: int  # of them, ended with a thread far behind (another process held its core)
    solo_periods: int  # times the regions went to one thread
    solo_left: int  # regions still to run on one thread
    backoff: int  # the next solo period's length, in regions
    adaptive: bool  # False under RADIXGEN_CPU_ADAPTIVE_TEAM=0


class NativeKernels:
    """Typed Python entry points over the compiled library."""

    def __init__(self, lib: ctypes.CDLL, isa: str, act_quant: str = "off") -> None:
        if act_quant not in ACT_QUANT_MODES:
            raise ValueError(f"act_quant must be one of {ACT_QUANT_MODES}, not {act_quant!r}")
        self._lib = lib
        self.isa = isa  # the instruction-set variant the library was built for (isa.py)
        formats = int(bind(lib, "qgemm_act_int8_formats")())
        # the quantized formats whose GEMM can take int8 activations in this build
        self.act_int8_formats = frozenset(f for f, c in QUANT_FORMATS.items() if formats >> c & 1)
        # "int8" / "int8x2" / "mixed": quantized linear layers quantize their activations where
        # the format allows (act_int8_formats); "off": float32 activations (the exact
        # dequantize-then-matmul)
        self.act_quant = act_quant
        self._ragged = bind(lib, "ragged_attention")
        self._add_rmsnorm = bind(lib, "add_rmsnorm")
        self._rope = bind(lib, "rope_store_kv")
        self._silu_mul = bind(lib, "silu_mul")
        self._greedy = bind(lib, "greedy_refine_bf16")
        self._refine = bind(lib, "refine_near_max_f32")
        self._argmax = bind(lib, "argmax_f32")
        self._gemm_elems = bind(lib, "gemm_bf16_packed_elems")
        self._gemm_pack = bind(lib, "gemm_bf16_pack")
        self._gemm = bind(lib, "gemm_bf16")
        self.has_bf16_gemm = bool(bind(lib, "gemm_bf16_available")())
        self._q_bytes = bind(lib, "qgemm_packed_bytes")
        self._q_pack = bind(lib, "qgemm_pack")
        self._q_rows = bind(lib, "qgemm_rows_bf16")
        self._qgemm = bind(lib, "qgemm")
        self.has_quant_gemm = bool(bind(lib, "qgemm_available")())
        self.decoder_stack_words = int(bind(lib, "decoder_stack_words")())
        self._stack_bytes = bind(lib, "decoder_stack_workspace_bytes")
        self._stack = bind(lib, "decoder_stack_forward")
        self._team_threads = bind(lib, "team_threads")
        self._team_report = bind(lib, "team_report")
        self._team_stats = bind(lib, "team_stats")
        self._team_reset = bind(lib, "team_reset")

    def team_threads(self) -> int:
        """Threads the calling thread's next kernel region gets (team.c: all of the OpenMP
        team, or one while its recent regions found the machine oversubscribed)."""
        return int(self._team_threads())

    def team_report(self, threads: int, t0: float, spread: float, t1: float) -> None:
        """Report one timed region to team.c (the kernels do it; tests drive it by hand)."""
        self._team_report(threads, t0, spread, t1)

    def team_stats(self) -> TeamStats:
        """The calling thread's adaptive-team counters (team.c)."""
        out = torch.zeros(6, dtype=torch.int64)
        self._team_stats(out.data_ptr())
        timed, late, periods, solo_left, backoff, adaptive = (int(v) for v in out.tolist())
        return TeamStats(timed, late, periods, solo_left, backoff, bool(adaptive))

    def team_reset(self) -> None:
        self._team_reset()

    def with_act_quant(self, act_quant: str) -> NativeKernels:
        """The same library with another activation mode (a new instance)."""
        return NativeKernels(self._lib, self.isa, act_quant)

    @property
    def act_quant_active(self) -> str:
        """act_quant where some format has the int8 path in this build, else "off"."""
        return self.act_quant if self.act_int8_formats else "off"

    def quant_code(self, w: QuantLinearWeight, act_quant: str | None = None) -> int:
        """`qgemm`'s fmt argument for `w`: its format code, with the ACT_FLAGS bit where the
        activations are quantized (act_quant, default this instance's)."""
        mode = self.act_quant if act_quant is None else act_quant
        if mode == "mixed":
            mode = "int8x2" if w.reads_norm else "int8"
        code = QUANT_FORMATS[w.fmt]
        return code | ACT_FLAGS[mode] if w.fmt in self.act_int8_formats else code

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

    # --- quantized linear layers (see gemm_quant.c) ------------------------------------------

    def pack_quant(
        self,
        q: torch.Tensor,
        d: torch.Tensor,
        m: torch.Tensor | None,
        fmt: str,
        bias: torch.Tensor | None = None,
    ) -> QuantLinearWeight:
        """Pack integers q [n, k] (uint8 0..15 for u4 / u4f, int8 for the others) with scales d
        (and mins m: u4, u4f, i8m) [n, k / 32] ([n, k / 16] for i8h), float16 (float32 for
        u4f, i8h and i8m), once at load time."""
        n, k = q.shape
        code = QUANT_FORMATS[fmt]
        scale_dtype = torch.float32 if fmt in ("u4f", "i8h", "i8m") else torch.float16
        group = QUANT_GROUP // 2 if fmt == "i8h" else QUANT_GROUP
        assert q.dtype == (torch.uint8 if fmt in ("u4", "u4f") else torch.int8)
        assert d.dtype == scale_dtype and d.shape == (n, k // group)
        has_min = fmt in ("u4", "u4f", "i8m")
        assert (m is not None) == has_min and (m is None or m.shape == d.shape)
        size = self._q_bytes(n, k, code)
        assert size >= 0, f"in_features {k} is not a multiple of {QUANT_GROUP}"
        q, d = q.contiguous(), d.contiguous()
        m = None if m is None else m.to(scale_dtype).contiguous()
        data = torch.empty(size, dtype=torch.uint8)
        self._q_pack(
            q.data_ptr(), d.data_ptr(), 0 if m is None else m.data_ptr(), n, k, code,
            data.data_ptr(),
        )  # fmt: skip
        b = None if bias is None else bias.detach().float().contiguous()
        return QuantLinearWeight(data, n, k, fmt, b)

    def linear_quant(
        self,
        x: torch.Tensor,
        w: QuantLinearWeight,
        out_dtype: torch.dtype = torch.bfloat16,
        act_quant: str | None = None,
    ) -> torch.Tensor:
        """x [M, in] bf16 -> x W^T + b as [M, out] bf16 (or float32); a row's result never
        depends on M. act_quant: an ACT_QUANT_MODES mode for this call (default this
        instance's)."""
        k = w.in_features
        assert x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[1] == k
        assert out_dtype in (torch.bfloat16, torch.float32)
        if x.stride(1) != 1 or x.stride(0) < k:
            x = x.contiguous()
        m = x.shape[0]
        y = torch.empty((m, w.out_features), dtype=out_dtype)
        if m == 0:
            return y
        rc = self._qgemm(
            x.data_ptr(), m, x.stride(0), w.data.data_ptr(), w.out_features, k,
            self.quant_code(w, act_quant), 0 if w.bias is None else w.bias.data_ptr(), y.data_ptr(),
            w.out_features, int(out_dtype == torch.float32),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"native qgemm failed with code {rc}")
        return y

    def quant_rows(self, w: QuantLinearWeight, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the dequantized weight, bf16 [len(ids), in] (an embedding lookup)."""
        ids = ids.to(torch.long).contiguous().view(-1)
        out = torch.empty((ids.numel(), w.in_features), dtype=torch.bfloat16)
        self._q_rows(
            w.data.data_ptr(), w.out_features, w.in_features, QUANT_FORMATS[w.fmt],
            ids.data_ptr(), ids.numel(), out.data_ptr(),
        )  # fmt: skip
        return out

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
        bitmask = _row_masks(bitmask, len(rows))
        masks, words = (0, 0) if bitmask is None else (bitmask.data_ptr(), bitmask.shape[1])
        self._greedy(
            logits.data_ptr(), logits.stride(0), hidden.data_ptr(), weight.data_ptr(),
            idx.data_ptr(), len(rows), vocab, hidden.shape[1], masks, words, out.data_ptr(),
        )  # fmt: skip
        ids: list[int] = out.tolist()
        return ids

    def argmax(
        self,
        logits: torch.Tensor,
        rows: list[int],
        vocab: int,
        bitmask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """torch's argmax of each given float32 logits row over its first `vocab` tokens, [R]
        long; with a bitmask (int32 [R, W], row r for rows[r]) over the allowed tokens only."""
        assert logits.dtype == torch.float32 and logits.stride(1) == 1
        out = torch.empty(len(rows), dtype=torch.long)
        every = rows == list(range(len(rows)))
        idx = None if every else torch.tensor(rows, dtype=torch.long)
        bitmask = _row_masks(bitmask, len(rows))
        masks, words = (0, 0) if bitmask is None else (bitmask.data_ptr(), bitmask.shape[1])
        self._argmax(
            logits.data_ptr(), logits.stride(0), 0 if idx is None else idx.data_ptr(), len(rows),
            vocab, masks, words, out.data_ptr(),
        )  # fmt: skip
        return out

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
            out.data_ptr(), n, h, float(eps), DTYPE_CODES[weight.dtype],
            DTYPE_CODES[weight.dtype if x is None else x.dtype],
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
        q_dtype: torch.dtype | None = None,
        kv_scales: KVScales = None,
    ) -> torch.Tensor:
        """Rotated q [N, H, D]; rotated k and v written into the pools at `out_cache_loc`.

        q has `q_dtype` (default: the pools' dtype); float32 qkv (an unrounded projection) under
        a bf16 model is rotated in float32 and rounded once. Pools of another format (int8 with
        `kv_scales`, fp8 e4m3 with or without them, bf16 under float32) get each row as q_dtype would hold it,
        quantized on store."""
        n = qkv.shape[0]
        q_dtype = q_dtype or k_pool.dtype
        assert (
            qkv.stride(1) == 1
            and positions.dtype == torch.long
            and out_cache_loc.dtype == torch.long
        )
        assert cos.dtype == torch.float32 and cos.is_contiguous() and k_pool.is_contiguous()
        assert qkv.dtype in (q_dtype, torch.float32) and v_pool.dtype == k_pool.dtype
        assert k_pool.dtype != torch.int8 or kv_scales is not None
        assert k_pool.dtype == q_dtype or head_dim <= 1024  # the kernel's row buffer
        ks, vs = _scale_ptrs(kv_scales, k_pool.shape[0], num_kv_heads)
        q = torch.empty((n, num_heads, head_dim), dtype=q_dtype)
        self._rope(
            qkv.data_ptr(), qkv.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), out_cache_loc.data_ptr(), n,
            num_heads, num_kv_heads, head_dim, DTYPE_CODES[q_dtype], DTYPE_CODES[qkv.dtype],
            KV_CODES[k_pool.dtype], ks, vs,
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
            gate_up.data_ptr(), out.data_ptr(), n, two_i // 2, DTYPE_CODES[out_dtype],
            DTYPE_CODES[gate_up.dtype],
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
        kv_scales: KVScales = None,
    ) -> None:
        """Causal attention of a ragged batch (see ragged_attention.c for the layout).

        q: [N, H, D] (rows may be strided), k/v_buf: [S, Hkv, D], out: [N, H, D] contiguous;
        request r's query rows are q_indptr[r]:q_indptr[r+1], the first at position q_pos0[r],
        and its keys' slots are kv_indices[kv_indptr[r]:kv_indptr[r+1]] by position. The pool
        may hold another format than q (int8 with float32 [S, Hkv] `kv_scales`, fp8 e4m3 with
        or without them, bf16): it is read in place, each row decoded as it is used.
        """
        _, h, d = q.shape
        assert q.stride(2) == 1 and q.stride(1) == d and out.is_contiguous()
        assert k_buf.is_contiguous() and v_buf.is_contiguous() and k_buf.dtype == v_buf.dtype
        assert k_buf.dtype != torch.int8 or kv_scales is not None
        for t in (kv_indices, kv_indptr, q_indptr, q_pos0):
            assert t.dtype == torch.long and t.is_contiguous()
        ks, vs = _scale_ptrs(kv_scales, k_buf.shape[0], k_buf.shape[1])
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
            DTYPE_CODES[q.dtype],
            window or 0,
            KV_CODES[k_buf.dtype],
            ks,
            vs,
        )
        if rc != 0:
            raise RuntimeError(
                f"native ragged_attention failed with code {rc} (shape {tuple(q.shape)})"
            )

    # --- the whole decoder stack (see decoder_stack.c) ---------------------------------------

    def decoder_stack_workspace_bytes(
        self, n: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int
    ) -> int:
        return int(self._stack_bytes(n, hidden, heads, kv_heads, head_dim, inter))

    def decoder_stack_forward(
        self,
        layers: torch.Tensor,
        dims: torch.Tensor,
        eps: float,
        scale: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        x: torch.Tensor,
        final_norm: torch.Tensor,
        rows: torch.Tensor | None,
        out: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        ragged: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        work: torch.Tensor,
        cancel: CancelFlag | None = None,
    ) -> None:
        """Every layer over the embeddings x (bf16 [N, hidden]), then `out` (bf16 [M, hidden])
        gets the final norm of `rows` (int64 [M]; None: every row) (decoder_stack.c). layers:
        int64 [L, decoder_stack_words]; dims: int64 [hidden, H, Hkv, D, inter, kv code];
        ragged: the attention layout. StepCancelled when `cancel` is set before a layer."""
        kv_indices, kv_indptr, q_indptr, q_pos0 = ragged
        rc = self._stack(
            layers.data_ptr(), layers.shape[0], dims.data_ptr(), eps, scale, cos.data_ptr(),
            sin.data_ptr(), x.data_ptr(), final_norm.data_ptr(),
            0 if rows is None else rows.data_ptr(), out.shape[0], out.data_ptr(),
            positions.data_ptr(), out_cache_loc.data_ptr(), x.shape[0], kv_indices.data_ptr(),
            kv_indptr.data_ptr(), q_indptr.data_ptr(), q_pos0.data_ptr(), q_indptr.numel() - 1,
            work.data_ptr(), 0 if cancel is None else cancel.address,
        )  # fmt: skip
        if rc == DECODER_STACK_CANCELLED:
            raise StepCancelled
        if rc != 0:
            raise RuntimeError(f"native decoder_stack_forward failed with code {rc}")
