"""How many tokens the KV pool holds (scheduler process): `--max-total-tokens`, else the
memory fraction's share of what the device has free once the weights are in."""

from __future__ import annotations

import torch

from radixgen.kernels.kv_quant import KVCacheFormat
from radixgen.runtime.mem_cache.memory_pool import kv_capacity_tokens
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.server_args import CacheConfig


def kv_pool_tokens(
    cache: CacheConfig,
    kv_format: KVCacheFormat,
    cfg: ModelArchConfig,
    kv_heads: int,
    device: torch.device,
) -> int:
    """The pool's token capacity for `kv_heads` heads a layer (this rank's, under TP) stored in
    `kv_format` on `device`."""
    if cache.max_total_tokens is not None:
        return cache.max_total_tokens
    # NOTE: the stored format's bytes, scales included: int8 / fp8 hold ~2x bf16's tokens
    per_token = kv_format.bytes_per_token(cfg.num_layers, kv_heads, cfg.head_dim)
    if device.type == "cuda":
        # SGLang's reading of the fraction: of the device memory free once weights are in
        free, _ = torch.cuda.mem_get_info(device)
        budget = free * cache.mem_fraction_static
    else:
        import psutil

        budget = psutil.virtual_memory().available * cache.mem_fraction_static
    return kv_capacity_tokens(budget, per_token, cache.page_size)
