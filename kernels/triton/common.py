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
