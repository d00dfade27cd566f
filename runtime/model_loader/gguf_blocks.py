"""GGUF quantized blocks split into the planes the quantized GEMM packs: integers q, float16
scales d and mins m per group of 32 along k (w = d * q + m), exactly what the file stores.

Runs in the scheduler process while loading (and in tests). Q4_1 is u4 with scale and min,
Q4_0 u4 with min -8 d (exact in float16: a power-of-two multiple), Q8_0 int8 with scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# GGML type ids (gguf.GGMLQuantizationType) of the block types kept quantized
Q4_0, Q4_1, Q8_0 = 2, 3, 8
KEPT_TYPES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}
_BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
GROUP = 32


@dataclass(frozen=True)
class QuantPlanes:
    """One [n, k] weight as integer planes: fmt "u4" (q uint8 0..15, d, m) or "i8" (q int8, d)."""

    fmt: str
    q: np.ndarray  # [n, k]
    d: np.ndarray  # float16 [n, k / 32]
    m: np.ndarray | None  # float16 [n, k / 32] (u4 only)

    def take_rows(self, order: np.ndarray) -> QuantPlanes:
        """The same weight with its output rows permuted (blocks run along k, rows move whole)."""
        m = None if self.m is None else self.m[order]
        return QuantPlanes(self.fmt, self.q[order], self.d[order], m)

    def dequantize(self) -> np.ndarray:
        """float32 [n, k]: d * q + m per group (the oracle the kernels are tested against)."""
        n, k = self.q.shape
        q = self.q.astype(np.float32).reshape(n, k // GROUP, GROUP)
        w = q * self.d.astype(np.float32)[..., None]
        if self.m is not None:
            w = w + self.m.astype(np.float32)[..., None]
        return w.reshape(n, k)


def concat_rows(parts: list[QuantPlanes]) -> QuantPlanes:
    """Weights of one format stacked along the output rows (fused q/k/v, gate/up)."""
    fmts = {p.fmt for p in parts}
    assert len(fmts) == 1, f"cannot fuse weights of formats {fmts}"
    ms = [p.m for p in parts]
    m = None if any(x is None for x in ms) else np.concatenate(ms)  # type: ignore[arg-type]
    return QuantPlanes(
        fmts.pop(), np.concatenate([p.q for p in parts]), np.concatenate([p.d for p in parts]), m
    )


def split_blocks(raw: np.ndarray, qtype: int, n: int, k: int) -> QuantPlanes:
    """Raw GGUF bytes of an [n, k] tensor of a KEPT_TYPES type -> its planes."""
    if qtype not in KEPT_TYPES:
        raise ValueError(f"GGML type {qtype} is not kept quantized")
    if k % GROUP:
        raise ValueError(f"row length {k} is not a multiple of {GROUP}")
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
