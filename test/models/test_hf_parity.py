"""Our ModelRunner reproduces transformers' logits for every supported architecture variant.

Each request's tokens go through prefill, extend-on-cached-prefix and decode steps, several
requests mixed in one ForwardBatch, and every logit row is compared with HF's full-sequence
forward at the same position: a wrong mask, rope, bias, KV slot or GQA mapping shows up here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from model_harness import (
    VARIANTS,
    Session,
    build_hf_model,
    hf_logits,
    make_runner,
    max_rel_err,
    random_ids,
    save_hf_model,
    tiny_config,
)

# One schedule of (request, new tokens) per step: prefill, extend on a prefix, decode, then
# mixed steps where a decode row, a fresh prefill, a 1-token prompt and extends share a batch.
SCHEDULE: list[list[tuple[int, int]]] = [
    [(0, 20)],
    [(0, 12)],
    [(0, 1)],
    [(0, 1), (1, 16), (2, 1)],
    [(0, 1), (1, 7), (2, 13)],
    [(0, 1), (1, 1), (2, 1)],
    [(2, 1), (0, 1), (1, 1)],
    [(1, 1), (2, 5), (0, 1)],
]
FP32_TOL = 1e-4  # relative to the largest reference logit
BF16_TOL = 0.1  # HF's own bf16 forward is 3-5 % off its fp32 one on these models


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    """Each variant's HF model and its saved folder, built once per module."""
    cache: dict[str, tuple[Any, Path]] = {}

    def get(variant: str) -> tuple[Any, Path]:
        if variant not in cache:
            model = build_hf_model(tiny_config(variant), seed=len(cache))
            cache[variant] = (model, save_hf_model(model, tmp_path_factory.mktemp(variant)))
        return cache[variant]

    return get  # type: ignore[return-value]


def run_schedule(
    model: Any,
    folder: Path,
    dtype: str,
    native: bool,
    schedule: Sequence[Sequence[tuple[int, int]]],
) -> float:
    """Run `schedule` through our runner; return the worst relative error against HF fp32."""
    n_req = 1 + max(r for step in schedule for r, _ in step)
    totals = [sum(n for step in schedule for r, n in step if r == i) for i in range(n_req)]
    seqs = [random_ids(t, seed=100 + i) for i, t in enumerate(totals)]
    refs = [hf_logits(model, s) for s in seqs]
    session = Session(make_runner(folder, dtype, native))
    slots = [session.new_request() for _ in seqs]
    done = [0] * n_req
    worst = 0.0
    for step in schedule:
        chunks = [(slots[r], seqs[r][done[r] : done[r] + n]) for r, n in step]
        outs = session.step(chunks)
        for (r, n), out in zip(step, outs, strict=True):
            assert out.shape == (n, model.config.vocab_size)
            worst = max(worst, max_rel_err(out, refs[r][done[r] : done[r] + n]))
            done[r] += n
    return worst


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fp32_matches_hf(saved: Any, variant: str, native: bool) -> None:
    model, folder = saved(variant)
    assert run_schedule(model, folder, "float32", native, SCHEDULE) < FP32_TOL


@pytest.mark.parametrize("variant", ["llama_gqa", "mistral_window", "qwen2_tied"])
def test_bf16_close_to_hf(saved: Any, variant: str) -> None:
    model, folder = saved(variant)
    assert run_schedule(model, folder, "bfloat16", True, SCHEDULE) < BF16_TOL


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_long_decode_splits_keys(saved: Any, native: bool) -> None:
    """Past 256 keys the native kernel splits a request's keys into blocks merged by
    log-sum-exp (MQA keeps one (request, kv-head) pair, so this holds whatever the thread
    count); a sliding window must also hold over a long cached prefix."""
    long = [[(0, 150)], [(0, 140)], [(0, 1)], [(0, 1), (1, 300)], [(0, 1), (1, 1)]]
    for variant in ("llama_mqa", "mistral_window"):
        model, folder = saved(variant)
        assert run_schedule(model, folder, "float32", native, long) < FP32_TOL, variant


def test_sharded_checkpoint(tmp_path: Path) -> None:
    """Several *.safetensors files plus the index json load like one file."""
    model = build_hf_model(tiny_config("qwen2_untied_hd8"), seed=7)
    folder = save_hf_model(model, tmp_path / "sharded", max_shard_size="60KB")
    shards = sorted(folder.glob("*.safetensors"))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(shards) >= 3
    assert {p.name for p in shards} == set(index["weight_map"].values())
    assert run_schedule(model, folder, "float32", True, SCHEDULE[:4]) < FP32_TOL


@pytest.mark.parametrize(
    ("variant", "plain"),
    [
        ("mistral_window", {"sliding_window": None}),
        ("qwen2_window_layers", {"use_sliding_window": False}),
        ("llama3_rope", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
        ("llama_linear_rope", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ],
)
def test_features_are_visible(variant: str, plain: dict[str, Any]) -> None:
    """Guard for the parity tests: the window / rope scaling changes these models' logits far
    beyond the tolerance, so an implementation that ignored it could not pass."""
    ids = random_ids(40, seed=1)
    with_feature = hf_logits(build_hf_model(tiny_config(variant)), ids)
    without = hf_logits(build_hf_model(tiny_config(variant, **plain)), ids)
    assert max_rel_err(without, with_feature) > 100 * FP32_TOL


def test_model_config_reads_hf_configs(saved: Any) -> None:
    """Per-layer windows and rope scaling as transformers defines them."""
    from radixgen.runtime.models.model_config import ModelArchConfig

    cfg = ModelArchConfig.from_folder(saved("qwen2_window_layers")[1])
    assert cfg.layer_sliding_windows == (None, 6, 6)
    cfg = ModelArchConfig.from_folder(saved("mistral_window")[1])
    assert cfg.layer_sliding_windows == (7, 7) and cfg.sliding_window == 7
    cfg = ModelArchConfig.from_folder(saved("llama3_rope")[1])
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.layer_sliding_windows == (None, None)
    cfg = ModelArchConfig.from_folder(saved("qwen2_tied")[1])
    assert cfg.tie_word_embeddings and cfg.qkv_bias and not cfg.o_bias
    assert cfg.rope_scaling is None and torch.isfinite(torch.tensor(cfg.rope_theta))


def test_load_model_builds_the_runner_weights(saved: Any, monkeypatch: Any) -> None:
    """`load_model` (one allocation in the target dtype, no init) fills every parameter exactly
    as the runner's loader does, and leaves no parameter uninitialised (checked with the dense
    copies kept); by default a bf16 model's packed linear layers then free their dense copies
    and compute bitwise what they computed with them."""
    from radixgen.runtime.layers.linear import Linear, prepack_weight
    from radixgen.runtime.model_loader.weights import load_model
    from radixgen.runtime.models.model_config import ModelArchConfig

    _, folder = saved("llama_mha_bias")
    runner = make_runner(folder)
    cfg = ModelArchConfig.from_folder(folder)
    with monkeypatch.context() as keep:
        keep.setattr(Linear, "release_dense", lambda self: None)
        kept = load_model(folder, cfg, torch.bfloat16, "cpu", 1001)
    released = load_model(folder, cfg, torch.bfloat16, "cpu", 1001)
    pairs = [
        (a, b)
        for a, b in zip(kept.modules(), released.modules(), strict=True)
        if isinstance(a, Linear) and a.packed is not None
    ]
    if prepack_weight(torch.ones(8, 8, dtype=torch.bfloat16)) is None:
        # oneDNN packs bf16 only with AVX512-BW/VL/DQ or AVX-NE-CONVERT: on an AVX2-only CPU no
        # layer is packed, and every layer must keep its dense weight to compute at all
        assert not pairs
        assert all(m.weight.numel() > 0 for m in released.modules() if isinstance(m, Linear))
    else:
        assert pairs, "no layer was packed"
    for a, b in pairs:
        assert b.weight.numel() == 0 and a.weight.numel() > 0
        x_in = torch.randn(3, a.in_features).bfloat16()
        assert torch.equal(a.forward(x_in), b.forward(x_in))
    for dtype in (torch.float32, torch.bfloat16):
        with monkeypatch.context() as keep:
            keep.setattr(Linear, "release_dense", lambda self: None)
            built = load_model(folder, cfg, dtype, "cpu", 1001)
        ours = dict(built.named_parameters())
        for name, param in runner.model.named_parameters():
            assert ours[name].dtype == dtype and not ours[name].requires_grad
            assert torch.equal(ours[name], param.to(dtype)), name
        assert torch.equal(built.rotary.cos, runner.model.rotary.cos)
