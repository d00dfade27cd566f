"""The decoder's fused layer ops as Triton kernels: the CUDA counterpart of the native CPU
kernels' add_rmsnorm / rope_store_kv / silu_mul (same signatures, same numerics), handed to
the model by the model runner (`radixgen.kernels.layer_ops.select_gpu_fused_ops`)."""

from __future__ import annotations

import torch

from .activation import silu_mul
from .norm import add_rmsnorm
from .rotary_kv import rope_store_kv


class TritonFusedOps:
    """add + RMSNorm, rotary + KV store and SiLU-mul, one kernel launch each.

    NOTE: no method synchronises with the host or reads a tensor's values on the host, so a
    decode step that calls them can be captured in a CUDA graph.
    """

    def add_rmsnorm(
        self, x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x (in place, float32); returns norm(residual) * weight in weight's
        dtype."""
        return add_rmsnorm(x, residual, weight, eps)

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
        """Rotated q [N, H, D]; rotated k and v written into the pools at `out_cache_loc`.

        NOTE: the pools are in the model dtype here: quantized KV is refused on the GPU
        backends (attention/base.py `refuse_converted_kv`) before any step runs."""
        assert kv_scales is None and q_dtype in (None, k_pool.dtype), "quantized KV on the GPU"
        return rope_store_kv(
            qkv, positions, cos, sin, k_pool, v_pool, out_cache_loc,
            num_heads, num_kv_heads, head_dim,
        )  # fmt: skip

    def silu_mul(self, gate_up: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """silu(gate) * up for gate_up = [gate | up] rows, in out_dtype (default: gate_up's)."""
        return silu_mul(gate_up, out_dtype)
