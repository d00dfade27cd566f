"""GGUF quantized blocks split into the planes the quantized GEMM packs: integers q, scales d
and mins m per group of 32 along k (w = d * q + m), exactly what the file stores.

Runs in the scheduler process while loading (and in tests). Q4_1 is u4 with float16 scale and
min, Q4_0 u4 with min -8 d (exact in float16: a power-of-two multiple), Q8_0 int8 with scale,
Q4_K u4 with float32 scale d * sc and min -dmin * m per 32 (exact: 6-bit integers times
float16 values), Q5_K the same with 5-bit q held in bytes ("i8m"), Q6_K int8 (q - 32) with a
float32 scale d * sc per 16 ("i8h").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# GGML type ids (gguf.GGMLQuantizationType) of the block types kept quantized
Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 8, 12, 13, 14
KEPT_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
_Q4_K_BYTES, _Q5_K_BYTES, _Q6_K_BYTES, _SUPER = 144, 176, 210, 256
GROUP = 32


@dataclass(frozen=True)
class QuantPlanes:
    """One [n, k] weight as integer planes: fmt "u4" (q uint8 0..15, d, m) or "i8" (q int8, d)."""

    fmt: str
    q: np.ndarray  # [n, k]
    d: np.ndarray  # float16 [n, k / 32] (float32 for u4f)
    m: np.ndarray | None  # like d (u4 / u4f only)

    def take_rows(self, order: np.ndarray) -> QuantPlanes:
        """The same weight with its output rows permuted (blocks run along k, rows move whole)."""
        m = None if self.m is None else self.m[order]
        return QuantPlanes(self.fmt, self.q[order], self.d[order], m)

    def dequantize(self) -> np.ndarray:
        """float32 [n, k]: d * q + m per group (the oracle the kernels are tested against)."""
        n, k = self.q.shape
        group = k // self.d.shape[1]
        q = self.q.astype(np.float32).reshape(n, k // group, group)
        w = q * self.d.astype(np.float32)[..., None]
        if self.m is not None:
            w = w + self.m.astype(np.float32)[..., None]
        return w.reshape(n, k)


def concat_rows(parts: list[QuantPlanes]) -> QuantPlanes:
    """Weights of one format stacked along the output rows (fused q/k/v, gate/up)."""
    fmts = {p.fmt for p in parts}
    assert len(fmts) == 1, f"cannot fuse weights of formats {fmts}"
    ms = [p.m for p in parts]
    m: np.ndarray | None = (
        None if any(x is None for x in ms) else np.concatenate(ms)  # type: ignore[arg-type]
    )
    return QuantPlanes(
        fmts.pop(), np.concatenate([p.q for p in parts]), np.concatenate([p.d for p in parts]), m
    )


def split_blocks(raw: np.ndarray, qtype: int, n: int, k: int) -> QuantPlanes:
    """Raw GGUF bytes of an [n, k] tensor of a KEPT_TYPES type -> its planes."""
    if qtype not in KEPT_TYPES:
        raise ValueError(f"GGML type {qtype} is not kept quantized")
    if k % GROUP:
        raise ValueError(f"row length {k} is not a multiple of {GROUP}")
    if qtype in (Q4_K, Q5_K):
        return _split_q45_k(raw, qtype, n, k)
    if qtype == Q6_K:
        return _split_q6_k(raw, n, k)
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n, k // GROUP, _BLOCK_BYTES[qtype])
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
    if qtype == Q8_0:
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k)
        return QuantPlanes("i8", q, d, None)
    start = 4 if qtype == Q4_1 else 2
    qs = blocks[..., start : start + 16]
    q = np.concatenate((qs & 15, qs >> 4), axis=-1).reshape(n, k).astype(np.uint8)
    if qtype == Q4_1:
        m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
    else:
        with np.errstate(over="raise"):
            m = (d.astype(np.float32) * -8.0).astype(np.float16)
        if not np.array_equal(m.astype(np.float32), d.astype(np.float32) * -8.0):
            raise ValueError("a Q4_0 scale is too large for its min (-8 d) in float16")
    return QuantPlanes("u4", q, d, m)


def _split_q45_k(raw: np.ndarray, qtype: int, n: int, k: int) -> QuantPlanes:
    """Q4_K / Q5_K super-blocks (256 weights: float16 d, dmin, twelve bytes of 6-bit scales and
    mins, [Q5_K: 32 bytes of high bits,] 128 bytes of nibbles) -> planes with one float32 scale
    and min per 32: u4f (Q4_K) or i8m (Q5_K)."""
    if k % _SUPER:
        raise ValueError(f"row length {k} is not a multiple of {_SUPER}")
    size = _Q4_K_BYTES if qtype == Q4_K else _Q5_K_BYTES
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, k // _SUPER, size)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    dmin = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
    sc = b[..., 4:16].astype(np.uint8)
    scale = np.empty((*b.shape[:2], 8), np.uint8)
    mins = np.empty_like(scale)
    scale[..., :4], mins[..., :4] = sc[..., 0:4] & 63, sc[..., 4:8] & 63
    scale[..., 4:] = (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)
    mins[..., 4:] = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    qs = b[..., size - 128 :].reshape(n, k // _SUPER, 4, 32)  # 4 chunks of 64: lo, hi nibbles
    q = np.stack((qs & 15, qs >> 4), axis=3)  # [n, nb, chunk, half, 32]
    ds = (d[..., None] * scale.astype(np.float32)).reshape(n, k // GROUP)
    ms = (-(dmin[..., None] * mins.astype(np.float32))).reshape(n, k // GROUP)
    if qtype == Q4_K:
        return QuantPlanes("u4f", q.reshape(n, k).astype(np.uint8), ds, ms)
    qh = b[..., 16:48][:, :, None, None, :]  # bit 2 * chunk + half of byte l
    shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :])[None, None, :, :, None]
    q = q | (((qh >> shift) & 1) << 4)
    return QuantPlanes("i8m", q.reshape(n, k).astype(np.int8), ds, ms)


def _split_q6_k(raw: np.ndarray, n: int, k: int) -> QuantPlanes:
    """Q6_K super-blocks (256 weights: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8
    scales, float16 d) -> i8h planes: q - 32 as int8, d * sc per 16."""
    if k % _SUPER:
        raise ValueError(f"row length {k} is not a multiple of {_SUPER}")
    nb = k // _SUPER
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, nb, _Q6_K_BYTES)
    ql = b[..., 0:128].reshape(n, nb, 2, 64)
    qh = b[..., 128:192].reshape(n, nb, 2, 32)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
    d = np.ascontiguousarray(b[..., 208:210]).view(np.float16)[..., 0].astype(np.float32)
    lo = np.stack(
        (ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4), axis=3
    )  # [n, nb, half, 4 quarters, 32]
    hi = np.stack([(qh >> (2 * c)) & 3 for c in range(4)], axis=3)
    q = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8).reshape(n, k)
    ds = (d[..., None] * sc).reshape(n, k // 16)
    return QuantPlanes("i8h", q, ds.astype(np.float32), None)


def quantize_int8_per_channel(w: np.ndarray) -> QuantPlanes:
    """Weight-only int8 of a float [n, k] weight, one scale per output channel (max |w| / 127,
    in float16), repeated for every group so the i8 kernel serves it."""
    k = w.shape[1]
    if k % GROUP:
        raise ValueError(f"row length {k} is not a multiple of {GROUP}")
    w = w.astype(np.float32, copy=False)
    scale = (np.abs(w).max(axis=1) / 127.0).astype(np.float16)
    scale = np.where(scale == 0, np.float16(1.0), scale).astype(np.float16)
    q = np.clip(np.rint(w / scale.astype(np.float32)[:, None]), -127, 127).astype(np.int8)
    d = np.repeat(scale[:, None], k // GROUP, axis=1)
    return QuantPlanes("i8", q, np.ascontiguousarray(d), None)
