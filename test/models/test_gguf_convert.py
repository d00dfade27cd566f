"""GGUF -> HF conversion: every tensor type decodes exactly, q/k rows are un-permuted, and the
converted folder runs to the same logits as transformers on the same (dequantized) weights.

The tiny GGUF files are written here the way llama.cpp's converter writes them (see
gguf_blocks.py); expected values come from an independent block decoder, not the `gguf` package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf_blocks import Q, llama_cpp_permute, ref_unpermute, write_tiny_gguf
from model_harness import Session, build_hf_model, hf_logits, make_runner, max_rel_err, random_ids
from safetensors.numpy import load_file
from transformers import LlamaConfig, MistralConfig, Qwen2Config

from radixgen.runtime.model_loader.gguf_convert import convert_gguf

# worst |decoded - original| / max|original| per tensor for types the gguf package quantizes
QUANT_ERR = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 1e-2, Q.Q4_0: 0.15, Q.Q4_1: 0.1}
ALL_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]
_TINY: dict[str, Any] = dict(vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-5)


def hf_state(model: Any) -> dict[str, np.ndarray]:
    """HF tensors as numpy, without the head when it is tied to the embedding."""
    tied = model.config.tie_word_embeddings
    return {
        k: v.detach().numpy().copy()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }


def convert(tmp: Path, arch: str, model: Any, qtype: Q) -> tuple[Path, dict[str, np.ndarray]]:
    """Write `model` as a GGUF, convert it; return (folder, what each tensor must decode to)."""
    path = tmp / f"tiny-{arch}-{qtype.name}.gguf"
    expected = write_tiny_gguf(path, arch, model.config, hf_state(model), qtype)
    out = tmp / "converted"
    out.mkdir()
    convert_gguf(path, out)
    return out, expected


def check_logits(model: Any, expected: dict[str, np.ndarray], folder: Path) -> None:
    """HF on the expected (dequantized) weights vs our runner on the converted folder."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in expected:
                param.copy_(torch.from_numpy(expected[name]))
    ids = random_ids(24, seed=3)
    ref = hf_logits(model, ids)
    session = Session(make_runner(folder, "float32", native=True))
    slot = session.new_request()
    outs = session.step([(slot, ids[:20])])
    outs += [session.step([(slot, [t])])[0] for t in ids[20:]]
    assert max_rel_err(torch.cat(outs), ref) < 1e-4


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_every_type_decodes_exactly(tmp_path: Path, qtype: Q) -> None:
    """Rows of 256 so the K-quants (256-element super-blocks) fit every matrix."""
    cfg = LlamaConfig(
        **_TINY,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = build_hf_model(cfg, seed=11)
    original = hf_state(model)
    folder, expected = convert(tmp_path, "llama", model, qtype)
    got = load_file(str(folder / "model.safetensors"))
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == want.shape, name
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6 * scale, err_msg=name)
        if qtype in QUANT_ERR:
            err = np.abs(got[name] - original[name]).max() / np.abs(original[name]).max()
            assert err <= QUANT_ERR[qtype], (name, err)
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == 512 and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is False
    assert not (folder / "tokenizer.json").exists()  # no tokenizer metadata in this GGUF
    check_logits(model, expected, folder)


def test_llama_qk_unpermute_with_bias(tmp_path: Path) -> None:
    """llama.cpp permutes q/k weights AND biases for its rope layout; both must come back."""
    cfg = LlamaConfig(
        **_TINY,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
    )
    model = build_hf_model(cfg, seed=5)
    original = hf_state(model)
    q = original["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(llama_cpp_permute(q, 4), q)  # the permutation is not a no-op
    assert np.array_equal(ref_unpermute(llama_cpp_permute(q, 4), 4), q)
    folder, expected = convert(tmp_path, "llama", model, Q.F32)
    got = load_file(str(folder / "model.safetensors"))
    for name, want in original.items():
        assert np.array_equal(got[name], want), name
    config = json.loads((folder / "config.json").read_text())
    assert config["attention_bias"] is True
    check_logits(model, expected, folder)


def test_llama3_rope_freqs_tensor_matches_hf_llama3_scaling(tmp_path: Path) -> None:
    """Llama 3.1+ GGUFs carry rope scaling as rope_freqs.weight (one divisor per frequency, as
    llama.cpp's converter writes it); the result must match HF's llama3 rope scaling."""
    scaling = {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }  # fmt: skip
    cfg = LlamaConfig(
        **_TINY, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_scaling=scaling,
    )  # fmt: skip
    model = build_hf_model(cfg, seed=6)
    head_dim = 64 // 4
    theta = cfg.rope_parameters["rope_theta"]
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factors = (base / model.model.rotary_emb.inv_freq.float()).numpy()
    assert factors.max() > 1.5 * factors.min()  # a real, frequency-dependent scaling
    path = tmp_path / "tiny-llama31.gguf"
    expected = write_tiny_gguf(
        path, "llama", cfg, hf_state(model), Q.F32, extra_tensors={"rope_freqs.weight": factors}
    )
    out = tmp_path / "converted"
    out.mkdir()
    convert_gguf(path, out)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_freq_factors"] == pytest.approx(factors.tolist())
    check_logits(model, expected, out)


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_qwen2_tied_no_permutation(tmp_path: Path, qtype: Q) -> None:
    """qwen2 GGUFs keep HF's q/k row order; a missing output.weight means tied embeddings."""
    cfg = Qwen2Config(
        **_TINY,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = build_hf_model(cfg, seed=6)
    folder, expected = convert(tmp_path, "qwen2", model, qtype)
    got = load_file(str(folder / "model.safetensors"))
    assert "lm_head.weight" not in got
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-7, err_msg=name)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"]
    check_logits(model, expected, folder)


def test_mistral_sliding_window_from_metadata(tmp_path: Path) -> None:
    """`mistral.attention.sliding_window` becomes the config's window, honoured in the forward."""
    cfg = MistralConfig(
        **_TINY,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=5,
    )
    model = build_hf_model(cfg, seed=8)
    folder, expected = convert(tmp_path, "mistral", model, Q.F32)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["sliding_window"] == 5
    check_logits(model, expected, folder)


def test_reader_sees_written_types(tmp_path: Path) -> None:
    """The test writer really stores the requested block type (not silently f32)."""
    cfg = LlamaConfig(
        **_TINY,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model = build_hf_model(cfg, seed=1)
    for qtype in (Q.Q4_K, Q.Q6_K, Q.BF16):
        path = tmp_path / f"{qtype.name}.gguf"
        write_tiny_gguf(path, "llama", cfg, hf_state(model), qtype)
        kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
        assert kinds["blk.0.attn_q.weight"] == qtype
        assert kinds["blk.0.attn_norm.weight"] == Q.F32
