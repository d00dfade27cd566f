"""KV pool sizing per --kv-cache-dtype: the same memory budget holds ~2x the tokens with int8 or
fp8_e4m3 as with bf16, counting the scale bytes; the pool's tensors cost what the sizing says."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.kv_quant import resolve_kv_cache_format
from radixgen.runtime.mem_cache.memory_pool import TokenToKVPool, kv_capacity_tokens

# the default model (SmolLM2-135M): 30 layers, 3 KV heads, head dim 64
LAYERS, HKV, D = 30, 3, 64
BUDGET = 1 << 30  # 1 GiB


def _per_token(kv: str, model_dtype: torch.dtype = torch.bfloat16) -> int:
    return resolve_kv_cache_format(kv, model_dtype).bytes_per_token(LAYERS, HKV, D)


def test_quantized_formats_double_the_tokens_of_a_budget():
    bf16 = kv_capacity_tokens(BUDGET, _per_token("bf16"), 1)
    assert kv_capacity_tokens(BUDGET, _per_token("auto"), 1) == bf16  # auto = the bf16 model's
    assert bf16 == BUDGET // (2 * LAYERS * HKV * D * 2)
    for kv in ("int8", "fp8_e4m3"):
        tokens = kv_capacity_tokens(BUDGET, _per_token(kv), 1)
        # one byte per value plus a float32 scale per token, head and K/V: (64 + 4) / 128
        assert tokens == BUDGET // (2 * LAYERS * HKV * (D + 4))
        assert 1.85 < tokens / bf16 <= 2.0, (kv, tokens / bf16)
    # bf16 storage under a float32 model halves its pool too
    assert _per_token("bf16", torch.float32) * 2 == _per_token("auto", torch.float32)


@pytest.mark.parametrize("kv", ["auto", "bf16", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("page", [1, 16])
def test_pool_tensors_cost_what_the_sizing_counts(kv, page):
    fmt = resolve_kv_cache_format(kv, torch.bfloat16)
    pool = TokenToKVPool(512, page, LAYERS, HKV, D, torch.bfloat16, "cpu", fmt)
    tensors = [pool.k_buffer, pool.v_buffer, pool.k_scale, pool.v_scale]
    allocated = sum(t.numel() * t.element_size() for t in tensors if t is not None)
    slots = pool.k_buffer.shape[1]  # usable tokens + the padding page
    assert slots == pool.size + page
    assert allocated == slots * fmt.bytes_per_token(LAYERS, HKV, D)
    assert pool.bytes_per_token() == fmt.bytes_per_token(LAYERS, HKV, D)
    assert pool.k_buffer.dtype == fmt.storage and pool.kv_format.name == (
        "bf16" if kv == "auto" else kv
    )
    if fmt.scaled:  # the padding page reads as zeros
        assert pool.k_scale is not None and not pool.k_scale[:, :page].any()
    assert not pool.k_buffer[:, :page].float().any()
