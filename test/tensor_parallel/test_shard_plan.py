"""How a model splits over tensor-parallel ranks: exact tables, refusals, and checkpoint shards
that put the full tensors back together (no processes)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixgen.errors import InvalidRequestError
from radixgen.runtime.distributed.parallel_linear import shard_tensor
from radixgen.runtime.distributed.shard_plan import (
    check_tp_shape,
    padded_vocab_size,
    shard_config,
    tensor_shard,
)
from radixgen.runtime.models.model_config import ModelArchConfig

# the test model of test_tensor_parallel.py: 8 q heads, 2 KV heads, vocab 1000
TEST_CFG = ModelArchConfig.from_dict(
    {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
    }
)  # fmt: skip
DEFAULT_CFG = dataclasses.replace(
    TEST_CFG, vocab_size=49152, hidden_size=576, intermediate_size=1536, num_heads=9,
    num_kv_heads=3, head_dim=64,
)  # fmt: skip


def test_vocab_padding():
    assert padded_vocab_size(1000, 1) == 1024
    assert padded_vocab_size(1000, 2) == 1024
    assert padded_vocab_size(1000, 4) == 1024
    assert padded_vocab_size(49152, 3) == 49152  # 768 * 64: no padding at tp=3
    assert padded_vocab_size(100, 3) == 192  # 128 does not split in 3: a multiple of 192


@pytest.mark.parametrize(
    ("tp", "heads", "kv", "kv_starts", "inter", "vocab_rows"),
    [
        (1, 8, 2, [0], 256, 1024),
        (2, 4, 1, [0, 1], 128, 512),
        (4, 2, 1, [0, 0, 1, 1], 64, 256),  # 2 KV heads over 4 ranks: each replicated twice
    ],
)
def test_shard_tables(tp, heads, kv, kv_starts, inter, vocab_rows):
    shards = [tensor_shard(TEST_CFG, r, tp) for r in range(tp)]
    assert [s.num_heads for s in shards] == [heads] * tp
    assert [s.num_kv_heads for s in shards] == [kv] * tp
    assert [s.kv_head_start for s in shards] == kv_starts
    assert [s.intermediate for s in shards] == [inter] * tp
    assert [s.vocab_start for s in shards] == [r * vocab_rows for r in range(tp)]
    local = shard_config(TEST_CFG, shards[-1])
    assert (local.num_heads, local.num_kv_heads, local.head_dim) == (heads, kv, 16)
    assert local.vocab_size == vocab_rows


def test_default_model_splits_only_in_three():
    shard = tensor_shard(DEFAULT_CFG, 2, 3)
    assert (shard.num_heads, shard.num_kv_heads, shard.intermediate) == (3, 1, 512)
    with pytest.raises(InvalidRequestError, match="does not divide the model's 9 attention"):
        check_tp_shape(DEFAULT_CFG, 2)
    odd = dataclasses.replace(TEST_CFG, num_heads=12, num_kv_heads=3)
    with pytest.raises(InvalidRequestError, match="3 KV heads: one must divide the other"):
        check_tp_shape(odd, 2)


def _full_tensors(cfg: ModelArchConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_heads * d, cfg.num_kv_heads * d, cfg.intermediate_size
    shapes = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "lm_head.weight": (cfg.vocab_size, h),
        "model.layers.0.self_attn.q_proj.weight": (q, h),
        "model.layers.0.self_attn.q_proj.bias": (q,),
        "model.layers.0.self_attn.k_proj.weight": (kv, h),
        "model.layers.0.self_attn.v_proj.weight": (kv, h),
        "model.layers.0.self_attn.o_proj.weight": (h, q),
        "model.layers.0.self_attn.o_proj.bias": (h,),
        "model.layers.0.mlp.gate_proj.weight": (inter, h),
        "model.layers.0.mlp.up_proj.weight": (inter, h),
        "model.layers.0.mlp.down_proj.weight": (h, inter),
        "model.layers.0.input_layernorm.weight": (h,),
    }
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


@pytest.mark.parametrize("tp", [2, 4])
def test_checkpoint_shards_put_the_full_tensors_back(tp):
    cfg, d = TEST_CFG, TEST_CFG.head_dim
    full = _full_tensors(cfg)
    shards = [tensor_shard(cfg, r, tp) for r in range(tp)]
    parts = {n: [shard_tensor(n, t, cfg, s) for s in shards] for n, t in full.items()}
    for name in ("q_proj.weight", "q_proj.bias", "gate_proj.weight", "up_proj.weight"):
        name = next(n for n in full if n.endswith(name))
        assert torch.equal(torch.cat(parts[name]), full[name])
    for name in ("o_proj.weight", "down_proj.weight"):
        name = next(n for n in full if n.endswith(name))
        assert torch.equal(torch.cat(parts[name], dim=1), full[name])
    bias = parts["model.layers.0.self_attn.o_proj.bias"]  # added once, after the sum
    assert torch.equal(sum(bias), full["model.layers.0.self_attn.o_proj.bias"])
    assert all(not b.any() for b in bias[1:])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # padded rows are zeros
        rows = torch.cat(parts[name])
        assert rows.shape[0] == 1024
        assert torch.equal(rows[:1000], full[name]) and not rows[1000:].any()
    k = parts["model.layers.0.self_attn.k_proj.weight"]
    for r, s in enumerate(shards):  # rank r holds KV head r // (tp / 2)
        head = r // (tp // 2)
        assert torch.equal(
            k[r], full["model.layers.0.self_attn.k_proj.weight"][head * d : (head + 1) * d]
        )
        assert s.kv_head_start == head
    norm = "model.layers.0.input_layernorm.weight"
    assert all(torch.equal(p, full[norm]) for p in parts[norm])
