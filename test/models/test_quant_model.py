"""Models with weights kept quantized (`--quantization`): tiny GGUFs of each kept type through
the real ModelRunner, against HF transformers on the same (dequantized) weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gguf_blocks import Q, write_tiny_gguf
from model_harness import Session, build_hf_model, hf_logits, max_rel_err, random_ids
from transformers import LlamaConfig, Qwen2Config

from radixgen.errors import InvalidRequestError
from radixgen.kernels.cpu import (
    QuantLinearWeight,
    cpu_flags,
    load_native_kernels,
    select_wide_rows,
)
from radixgen.kernels.cpu.loader import (
    AMX_WIDE_ROWS_DEFAULT,
    AMX_WIDE_ROWS_DENSE_DEFAULT,
    GEMM_ENV,
    WIDE_ROWS_ENV,
)
from radixgen.runtime.layers.linear import Linear, onednn_packs_bf16
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.runtime.model_loader.gguf_convert import convert_gguf_cached
from radixgen.runtime.model_loader.quant_loader import QUANT_CACHE
from radixgen.runtime.models import causal_lm
from radixgen.server_args import ServerArgs

native = load_native_kernels()
pytestmark = pytest.mark.skipif(
    native is None or not native.has_quant_gemm, reason="CPU without AVX512-BF16"
)
_TINY: dict[str, Any] = dict(
    vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-5, hidden_size=64,
    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
)  # fmt: skip
# bf16 activations against HF's float32 on the very same weights (measured: 1.5-2.5e-2, the
# dequantized bf16 path 1.3-2.6e-2)
BF16_ACT_ERR = 3e-2


def _runner(folder: Path, quantization: str | None = None, dtype: str = "bfloat16"):
    args = ServerArgs.from_kwargs(dtype=dtype, max_total_tokens=4096, quantization=quantization)
    return ModelRunner(str(folder), args, context_length=1000)


def _gguf_model(tmp: Path, arch: str, qtype: Q, tied: bool = False):
    config = (Qwen2Config if arch == "qwen2" else LlamaConfig)(
        **_TINY, tie_word_embeddings=tied, **({"attention_bias": True} if arch == "llama" else {})
    )
    model = build_hf_model(config, seed=int(qtype) + 3)
    state = {
        k: v.detach().numpy().copy()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    path = tmp / f"tiny-{arch}-{qtype.name}.gguf"
    expected = write_tiny_gguf(path, arch, model.config, state, qtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in expected:
                param.copy_(torch.from_numpy(expected[name]))
    return model, convert_gguf_cached(path, tmp / "cache")


def _logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    session = Session(runner)
    slot = session.new_request()
    outs = session.step([(slot, ids[:20])])
    outs += [session.step([(slot, [t])])[0] for t in ids[20:]]
    return torch.cat(outs)


@pytest.mark.parametrize(
    ("arch", "qtype", "tied"),
    [("llama", Q.Q4_1, False), ("llama", Q.Q8_0, True), ("qwen2", Q.Q4_0, False)],
)
def test_gguf_weights_stay_quantized_and_match_hf(tmp_path: Path, arch, qtype, tied) -> None:
    model, folder = _gguf_model(tmp_path, arch, qtype, tied)
    runner = _runner(folder)  # auto: gguf for a GGUF model on this CPU
    assert runner.quantization == "gguf"
    linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(isinstance(m.packed, QuantLinearWeight) for m in linears)
    assert all(m.weight.numel() == 0 for m in linears)  # no dense copy kept
    assert runner.model.vocab.head_quant is not None and runner.model.vocab.embed_quant is not None
    ids = random_ids(24, seed=3)
    ours = _logits(runner, ids)
    assert ours.dtype == torch.float32  # the quantized head gives exact float32 logits
    err = max_rel_err(ours, hf_logits(model, ids))
    base = max_rel_err(_logits(_runner(folder, "unquant"), ids), hf_logits(model, ids))
    assert err < BF16_ACT_ERR and err < 1.5 * base  # as close as the bf16-weight path
    assert (folder / QUANT_CACHE).exists()
    again = _logits(_runner(folder, "gguf"), ids)  # from the packed cache: the same bits
    assert torch.equal(again, ours)


def test_batched_rows_equal_rows_alone(tmp_path: Path, monkeypatch) -> None:
    # the quantized GEMM's rows: no bf16 copies for wide steps (AMX CPUs keep them by default)
    monkeypatch.setenv(WIDE_ROWS_ENV, "0")
    _, folder = _gguf_model(tmp_path, "llama", Q.Q4_1)
    a, b = random_ids(9, seed=1), random_ids(13, seed=2)
    sa = Session(_runner(folder))
    ra, rb = sa.new_request(), sa.new_request()
    want_a, want_b = sa.step([(ra, a)])[0], sa.step([(rb, b)])[0]
    sb = Session(_runner(folder))
    rows = sb.step([(sb.new_request(), a), (sb.new_request(), b)])
    assert torch.equal(rows[0], want_a) and torch.equal(rows[1], want_b)


def test_wide_steps_take_bf16_copies_and_narrow_steps_the_quantized_weights(
    tmp_path: Path, monkeypatch
) -> None:
    if not onednn_packs_bf16():
        pytest.skip("oneDNN cannot pack bf16 weights on this CPU (AVX2 only): no copies")
    model, folder = _gguf_model(tmp_path, "llama", Q.Q4_1)
    monkeypatch.setenv(WIDE_ROWS_ENV, "0")
    plain = _runner(folder)
    assert all(m.wide is None for m in plain.model.modules() if isinstance(m, Linear))
    monkeypatch.setenv(WIDE_ROWS_ENV, "8")
    wide = _runner(folder)
    linears = [m for m in wide.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.wide is not None and m.wide_rows == 8 for m in linears)
    assert all(isinstance(m.packed, QuantLinearWeight) for m in linears)  # both kept
    assert wide.model.vocab.wide_packed is not None
    narrow_ids, wide_ids = random_ids(5, seed=5), random_ids(13, seed=6)
    # a step under the threshold runs the quantized weights: the same bits as without copies
    sp, sw = Session(plain), Session(wide)
    want = sp.step([(sp.new_request(), narrow_ids)])[0]
    assert torch.equal(sw.step([(sw.new_request(), narrow_ids)])[0], want)
    # a wide step runs the bf16 copies: close to the quantized rows and to HF, not the same bits
    want = sp.step([(sp.new_request(), wide_ids)])[0]
    got = sw.step([(sw.new_request(), wide_ids)])[0]
    assert not torch.equal(got, want)
    ref = hf_logits(model, wide_ids)
    assert max_rel_err(got, ref) < BF16_ACT_ERR and max_rel_err(got, want) < BF16_ACT_ERR
    # the re-scored greedy token of each row is the quantized path's (no near-tie at random)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_wide_copies_are_skipped_when_memory_is_short(tmp_path: Path, monkeypatch) -> None:
    if not onednn_packs_bf16():
        pytest.skip("oneDNN cannot pack bf16 weights on this CPU (AVX2 only): no copies")
    _, folder = _gguf_model(tmp_path, "llama", Q.Q8_0)
    monkeypatch.setenv(WIDE_ROWS_ENV, "4")
    monkeypatch.setattr(causal_lm, "WIDE_COPY_MEMORY_SHARE", 0.0)
    runner = _runner(folder)
    assert runner.model._wide_rows is None
    assert all(m.wide is None for m in runner.model.modules() if isinstance(m, Linear))
    assert runner.model.vocab.wide_packed is None
    s = Session(runner)
    assert s.step([(s.new_request(), random_ids(12, seed=7))])[0].shape[0] == 12


def test_the_wide_rows_choice(monkeypatch) -> None:
    monkeypatch.delenv(WIDE_ROWS_ENV, raising=False)
    assert select_wide_rows(native, "gguf") is None  # opt-in: rows stay batch-invariant
    monkeypatch.setenv(WIDE_ROWS_ENV, "auto")
    amx = "amx_bf16" in cpu_flags()
    assert select_wide_rows(native, "gguf") == (AMX_WIDE_ROWS_DEFAULT if amx else None)
    # a dense bf16 model: copies where the native bf16 GEMM serves the small steps
    dense = AMX_WIDE_ROWS_DENSE_DEFAULT if amx and native.has_bf16_gemm else None
    assert select_wide_rows(native, "unquant") == dense
    assert select_wide_rows(native, "unquant", torch.float32) is None
    monkeypatch.setenv(GEMM_ENV, "0")  # oneDNN for every step: nothing to copy
    assert select_wide_rows(native, "unquant") is None
    monkeypatch.delenv(GEMM_ENV)
    assert select_wide_rows(None, "gguf") is None
    monkeypatch.setenv(WIDE_ROWS_ENV, "0")
    assert select_wide_rows(native, "w8a16") is None
    monkeypatch.setenv(WIDE_ROWS_ENV, "24")
    assert select_wide_rows(native, "w8a16") == 24
    monkeypatch.setenv(WIDE_ROWS_ENV, "lots")
    assert select_wide_rows(native, "w8a16") is None


def test_int8_weight_only_of_a_dense_model(tmp_path: Path) -> None:
    model, folder = _gguf_model(tmp_path, "llama", Q.Q8_0)
    ids = random_ids(24, seed=4)
    runner = _runner(folder, "w8a16")
    assert runner.quantization == "w8a16"
    linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
    assert all(isinstance(m.packed, QuantLinearWeight) and m.packed.fmt == "i8" for m in linears)
    assert max_rel_err(_logits(runner, ids), hf_logits(model, ids)) < 0.05


def test_unquant_is_the_dequantized_path(tmp_path: Path) -> None:
    _, folder = _gguf_model(tmp_path, "llama", Q.Q4_1)
    runner = _runner(folder, "unquant")
    assert runner.quantization == "unquant"
    assert not any(
        isinstance(m.packed, QuantLinearWeight)
        for m in runner.model.modules()
        if isinstance(m, Linear)
    )
    assert _runner(folder, dtype="float32").quantization == "unquant"  # auto keeps float32 dense


def test_invalid_combinations_are_refused(tmp_path: Path) -> None:
    _, folder = _gguf_model(tmp_path, "llama", Q.Q4_1)
    with pytest.raises(InvalidRequestError, match="bfloat16"):
        _runner(folder, "gguf", dtype="float32")
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors"):
        (plain / name).write_bytes((folder / name).read_bytes())
    with pytest.raises(InvalidRequestError, match=r"needs a \.gguf model"):
        _runner(plain, "gguf")
    assert _runner(plain).quantization == "unquant"  # auto: a dense folder stays dense


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.F16], ids=lambda q: q.name)
def test_k_quants_kept_and_other_types_dense(tmp_path: Path, qtype: Q) -> None:
    """Q4_K (float32 scale and min per 32) and Q6_K (a float32 scale per 16) are kept quantized;
    a type that is not (F16 here) loads dense, and the file still runs."""
    config = LlamaConfig(**{**_TINY, "hidden_size": 256, "intermediate_size": 256})
    model = build_hf_model(config, seed=8)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    path = tmp_path / f"tiny-{qtype.name}.gguf"
    expected = write_tiny_gguf(path, "llama", model.config, state, qtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in expected:
                param.copy_(torch.from_numpy(expected[name]))
    folder = convert_gguf_cached(path, tmp_path / "cache")
    runner = _runner(folder)
    assert runner.quantization == "gguf"
    linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
    kept = [isinstance(m.packed, QuantLinearWeight) for m in linears]
    assert all(kept) if qtype != Q.F16 else not any(kept)
    ids = random_ids(24, seed=5)
    ours = _logits(runner, ids)
    if qtype == Q.F16:  # nothing kept: the dequantized path itself
        assert torch.equal(ours, _logits(_runner(folder, "unquant"), ids))
    else:
        assert max_rel_err(ours, hf_logits(model, ids)) < BF16_ACT_ERR


def test_other_architectures_run_dequantized(tmp_path: Path) -> None:
    from radixgen.runtime.model_loader.quant_loader import resolve_quantization

    _, folder = _gguf_model(tmp_path, "llama", Q.Q4_1)
    cpu_bf16 = ("cpu", torch.bfloat16, native)
    assert resolve_quantization(None, str(folder), *cpu_bf16, "LlamaForCausalLM") == "gguf"
    assert resolve_quantization(None, str(folder), *cpu_bf16, "Gemma2ForCausalLM") == "unquant"
    with pytest.raises(InvalidRequestError, match="Gemma2ForCausalLM runs dequantized"):
        resolve_quantization("gguf", str(folder), *cpu_bf16, "Gemma2ForCausalLM")


def test_a_cached_conversion_follows_its_gguf_to_a_new_place(tmp_path: Path) -> None:
    """The cache is keyed by the file's content: when the GGUF it was made from is gone (a
    deleted virtual environment) and the same file comes from elsewhere, the cached folder
    records the new place, so the weights are still served kept quantized."""
    import shutil

    from radixgen.runtime.model_loader.quant_loader import gguf_source

    (tmp_path / "first").mkdir()
    _, folder = _gguf_model(tmp_path / "first", "llama", Q.Q4_0)
    original = tmp_path / "first" / "tiny-llama-Q4_0.gguf"
    assert gguf_source(folder) == original
    moved = tmp_path / "second" / original.name
    moved.parent.mkdir()
    shutil.copy(original, moved)
    original.unlink()
    assert gguf_source(folder) is None  # the record names a file that is gone
    again = convert_gguf_cached(moved, tmp_path / "first" / "cache")
    assert again == folder
    assert gguf_source(folder) == moved


def test_no_copies_where_onednn_cannot_pack_bf16(tmp_path: Path, monkeypatch) -> None:
    _, folder = _gguf_model(tmp_path, "llama", Q.Q4_0)
    monkeypatch.setenv(WIDE_ROWS_ENV, "4")
    monkeypatch.setattr(causal_lm, "onednn_packs_bf16", lambda: False)  # as on AVX2-only CPUs
    runner = _runner(folder)
    assert runner.wide_rows is None and runner.model.vocab.wide_packed is None
    assert all(m.wide is None for m in runner.model.modules() if isinstance(m, Linear))
    s = Session(runner)
    assert s.step([(s.new_request(), random_ids(12, seed=8))])[0].shape[0] == 12
