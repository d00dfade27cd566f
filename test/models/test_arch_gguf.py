"""GGUF files of Qwen3, Gemma 2, Phi-3 (longrope), Mixtral (llama arch + experts), Qwen2-MoE and
Qwen3-MoE convert back to the exact HF checkpoint and run to HF's logits and greedy tokens
(float32)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from arch_harness import arch_config, arch_runner, hf_greedy, our_greedy
from gguf_arch_writer import checkpoint_state, write_arch_gguf
from model_harness import Session, build_hf_model, hf_logits, max_rel_err, random_ids, save_hf_model
from safetensors.numpy import load_file

from radixgen.runtime.model_loader.gguf_convert import convert_gguf

# our variant -> (GGUF architecture, HF architecture after conversion, config overrides)
CASES = {
    "qwen3": ("qwen3", "Qwen3ForCausalLM", {}),
    "qwen3_tied_bias_hd8": ("qwen3", "Qwen3ForCausalLM", {}),
    # llama.cpp scales Gemma 2 queries by head_dim: the HF model must too to compare
    "gemma2": ("gemma2", "Gemma2ForCausalLM", {"query_pre_attn_scalar": 16}),
    "phi3_longrope": ("phi3", "Phi3ForCausalLM", {}),
    "mixtral": ("llama", "MixtralForCausalLM", {}),
    "qwen2_moe": ("qwen2moe", "Qwen2MoeForCausalLM", {}),
    "qwen2_moe_norm_dense_layer": ("qwen2moe", "Qwen2MoeForCausalLM", {}),
    "qwen3_moe": ("qwen3moe", "Qwen3MoeForCausalLM", {}),
}


@pytest.mark.parametrize("variant", sorted(CASES))
def test_gguf_round_trip_runs_like_hf(tmp_path: Path, variant: str) -> None:
    arch, hf_arch, overrides = CASES[variant]
    cfg = arch_config(variant, **overrides)
    model = build_hf_model(cfg, seed=21)
    original = checkpoint_state(save_hf_model(model, tmp_path / "hf"))
    if cfg.tie_word_embeddings:
        original.pop("lm_head.weight", None)
    path = tmp_path / f"tiny-{variant}.gguf"
    write_arch_gguf(path, arch, cfg, original)
    out = tmp_path / "converted"
    out.mkdir()
    convert_gguf(path, out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [hf_arch]
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(original)
    for name, want in original.items():
        # Gemma 2's w + 1 and back is exact to float32 rounding only
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6, err_msg=name)
    ids = random_ids(36, seed=4)
    session = Session(arch_runner(out, native=True))
    slot = session.new_request()
    outs = session.step([(slot, ids[:30])])
    outs += [session.step([(slot, [t])])[0] for t in ids[30:]]
    import torch

    assert max_rel_err(torch.cat(outs), hf_logits(model, ids)) < 1e-4
    prompts = [random_ids(n, seed=50 + n) for n in (6, 11)]
    want = [hf_greedy(model, p, 10) for p in prompts]
    assert our_greedy(arch_runner(out, native=False), prompts, 10) == want
