"""The decoder's fused layer ops (add + RMSNorm, rotary + KV store, SiLU-mul): their contract,
and the GPU choice of an implementation, made once by the model runner (scheduler process).

On CPU the native C kernels (`radixgen.kernels.cpu.NativeKernels`) implement the contract; on
CUDA, RadixGen's Triton kernels (`radixgen.kernels.triton.fused_ops.TritonFusedOps`). Triton is
imported only when a CUDA model asks for them, so the CPU path never loads it.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXGEN_DISABLE_TRITON_OPS"  # "1": the torch layer ops on CUDA (comparisons)
FUSED_DTYPES = (torch.float32, torch.bfloat16)


class FusedLayerOps(Protocol):
    """What runtime/layers' RMSNorm, Attention and MLP call when the runner hands them fused ops."""

    def add_rmsnorm(
        self, x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x (in place, float32 [N, H]; x None: no add); returns norm(residual) *
        weight in weight's dtype. x: weight's dtype, or float32."""
        ...

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
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Half-split rotary of q and k of fused qkv rows [N, (H + 2 Hkv) D] at `positions`
        (float32 cos/sin tables [max positions, D]); returns q [N, H, D] in `q_dtype` (default:
        the pools' dtype) and writes k and v into the [slots, Hkv, D] pools at `out_cache_loc`
        (quantized when the pools hold int8 / fp8, with their [slots, Hkv] `kv_scales`)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """silu(gate) * up for [N, 2I] rows [gate | up] -> [N, I] in out_dtype (default: the
        input's)."""
        ...


def select_gpu_fused_ops(device: str, dtype: torch.dtype) -> FusedLayerOps | None:
    """The Triton fused layer ops for a model on a CUDA `device` in float32 or bfloat16, else
    None (the torch ops): on CPU, for float16, under RADIXGEN_DISABLE_TRITON_OPS=1, or when
    triton does not import (logged)."""
    if not device.startswith("cuda") or dtype not in FUSED_DTYPES:
        return None
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        from radixgen.kernels.triton.fused_ops import TritonFusedOps
    except ImportError as e:
        logger.warning("triton is unavailable, the model uses torch layer ops: %s", e)
        return None
    return TritonFusedOps()
