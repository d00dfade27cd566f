"""A compressed host tier (`--hicache-host-kv-dtype int8|fp8_e4m3`): blocks evicted from an
unscaled pool (bf16, fp16, float32) are kept at one byte per value with a float32 scale per
token and head, about twice the tokens of bf16 (four times float32's) in the same host memory.

Runs in the scheduler process. The quantization is the pool's own `--kv-cache-dtype` code
(`kernels/kv_quant.py`), so a compressed block read back is exactly what an int8 (or fp8) pool
would have held, dequantized to the pool's dtype: outputs served from it match those of a
`--kv-cache-dtype int8` pool for that prefix, not the unquantized recompute.
"""

from __future__ import annotations

import torch

from radixgen.kernels.kv_quant import KVCacheFormat, dequantize_kv, quantize_kv
from radixgen.runtime.mem_cache.memory_pool import KVBlock


class HostCompression:
    """Converts blocks between the pool's unscaled storage and a scaled one-byte format."""

    def __init__(self, fmt: KVCacheFormat, pool_storage: torch.dtype) -> None:
        assert fmt.quantized and fmt.scaled, "compression is to a scaled one-byte format"
        self.fmt = fmt
        self.pool_storage = pool_storage

    def compress(self, block: KVBlock) -> KVBlock:
        assert block.k_scale is None, "the pool is already scaled"
        k, k_scale = quantize_kv(block.k, self.fmt, self.pool_storage)
        v, v_scale = quantize_kv(block.v, self.fmt, self.pool_storage)
        return KVBlock(k, v, k_scale, v_scale)

    def decompress(self, block: KVBlock) -> KVBlock:
        k = dequantize_kv(block.k, block.k_scale, self.pool_storage)
        v = dequantize_kv(block.v, block.v_scale, self.pool_storage)
        return KVBlock(k, v)

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        return self.fmt.bytes_per_token(num_layers, num_kv_heads, head_dim)
