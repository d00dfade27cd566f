"""How many tokens the KV pool holds (scheduler process): `--max-total-tokens`, else the
memory fraction's share of what the device has free once the weights are in, and of no more
than this process's part of the device where several scheduler processes share it."""

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
    sharing: int = 1,
) -> int:
    """The pool's token capacity for `kv_heads` heads a layer (this rank's, under TP) stored in
    `kv_format` on `device`, which `sharing` scheduler processes use (`--dp-size 2` on one GPU:
    each replica sizes its pool at the same time, so each reads the free memory before the
    other's pool is in; capping each at its share of the device keeps them within it)."""
    if cache.max_total_tokens is not None:
        return cache.max_total_tokens
    # NOTE: the stored format's bytes, scales included: int8 / fp8 hold ~2x bf16's tokens
    per_token = kv_format.bytes_per_token(cfg.num_layers, kv_heads, cfg.head_dim)
    if device.type == "cuda":
        # SGLang's reading of the fraction: of the device memory free once weights are in
        budget = cuda_kv_budget(device, cache.mem_fraction_static, sharing)
    else:
        import psutil

        budget = psutil.virtual_memory().available * cache.mem_fraction_static
    return kv_capacity_tokens(budget, per_token, cache.page_size)


def cuda_kv_budget(device: torch.device, fraction: float, sharing: int) -> float:
    """Bytes for one process's KV pool: the fraction of what is free, and of no more than its
    1/`sharing` part of the device's total memory."""
    free, total = torch.cuda.mem_get_info(device)
    return kv_budget_bytes(free, total, fraction, sharing)


def kv_budget_bytes(free: int, total: int, fraction: float, sharing: int) -> float:
    return min(free, total / max(sharing, 1)) * fraction
