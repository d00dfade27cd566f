"""Pieces shared by the Triton kernels."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def exact_dots(dtype: torch.dtype) -> bool:
    """Whether the kernels' dot products run in float32 (IEEE, no TF32).

    float32 models need it for exactness. The interpreter needs it for bf16 too: its `tl.dot`
    reads bf16 operands wrongly (triton 3.9), so interpreted runs check the kernels' indexing and
    softmax with float32 products, and the tensor-core bf16 products are checked on a GPU.
    """
    return dtype == torch.float32 or interpreting()


@triton.jit
def dot(a, b, FP32: tl.constexpr):
    """a @ b accumulated in float32; with FP32 the operands are widened and no TF32 is used."""
    if FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def soft_cap(s, cap):
    """cap * tanh(s / cap) (Gemma 2's attention logits), from exp: tanh(x) = 1 - 2 / (e^2x + 1),
    which saturates to +-1 (never NaN) where e^2x over- or underflows."""
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))


@triton.jit
def round_bf16(x):
    """float32 x rounded to the nearest bfloat16 (ties to even), still as float32.

    NOTE: the kernels round through this before every bf16 store or bf16-rounded product: the
    interpreter's float32 -> bf16 conversion truncates (triton 3.9), so rounding is done on the
    bits, the same on a GPU and under the interpreter; the final `.to(tl.bfloat16)` is then
    exact. NaN passes through unchanged.
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def store_as(ptr, x, mask):
    """Store float32 x at ptr in the pointee's dtype (bf16: rounded to nearest, see round_bf16)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        tl.store(ptr, round_bf16(x).to(tl.bfloat16), mask=mask)
    else:
        tl.store(ptr, x.to(ptr.dtype.element_ty), mask=mask)
