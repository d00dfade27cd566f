"""A bad model folder or GGUF fails at load time with an error that names the problem.

Never a KeyError deep in the forward, a silently broadcast tensor or a half-initialised model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from model_harness import build_hf_model, make_runner, save_hf_model, tiny_config
from safetensors.torch import load_file, save_file

from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_loader import resolve_model_path
from radixgen.runtime.model_loader.gguf_convert import convert_gguf
from radixgen.runtime.models.model_config import ModelArchConfig


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return save_hf_model(build_hf_model(tiny_config("qwen2_tied")), tmp_path / "m")


def edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def edit_weights(folder: Path, fn: Any) -> None:
    path = folder / "model.safetensors"
    state = load_file(str(path))
    fn(state)
    save_file(state, str(path), metadata={"format": "pt"})


def test_good_folder_loads(folder: Path) -> None:
    """The baseline the other tests break one thing of."""
    runner = make_runner(folder)
    assert runner.cfg.architecture == "Qwen2ForCausalLM"


def test_unsupported_architecture(folder: Path) -> None:
    edit_config(folder, architectures=["GPT2LMHeadModel"])
    with pytest.raises(
        InvalidRequestError, match=r"unsupported architecture \['GPT2LMHeadModel'\]"
    ):
        make_runner(folder)


@pytest.mark.parametrize("kind", ["yarn", "dynamic", "longrope"])
def test_unknown_rope_scaling(folder: Path, kind: str) -> None:
    edit_config(folder, rope_parameters={"rope_type": kind, "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(InvalidRequestError, match=f"rope scaling type '{kind}' is not supported"):
        ModelArchConfig.from_folder(folder)


def test_rope_scaling_missing_factor(folder: Path) -> None:
    edit_config(folder, rope_scaling={"type": "linear"})
    with pytest.raises(InvalidRequestError, match=r"lacks \['factor'\]"):
        ModelArchConfig.from_folder(folder)


def test_legacy_rope_scaling_key(folder: Path) -> None:
    """transformers 4.x wrote `rope_scaling` with `type`; it still means the same."""
    edit_config(folder, rope_scaling={"type": "linear", "factor": 2.0})
    cfg = ModelArchConfig.from_folder(folder)
    assert cfg.rope_scaling == {"type": "linear", "factor": 2.0, "rope_type": "linear"}


def test_other_unsupported_configs(folder: Path) -> None:
    edit_config(folder, hidden_act="gelu")
    with pytest.raises(InvalidRequestError, match="hidden_act 'gelu'"):
        ModelArchConfig.from_folder(folder)
    edit_config(folder, hidden_act="silu", num_key_value_heads=3)
    with pytest.raises(InvalidRequestError, match="not a multiple of num_key_value_heads 3"):
        ModelArchConfig.from_folder(folder)


def test_missing_tensor(folder: Path) -> None:
    edit_weights(folder, lambda s: s.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(
        InvalidRequestError, match=r"missing 1 tensors.*layers\.1\.self_attn\.k_proj\.bias"
    ):
        make_runner(folder)


def test_shape_mismatch(folder: Path) -> None:
    edit_weights(folder, lambda s: s.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(
        InvalidRequestError, match=r"'model.norm.weight' has shape \(65,\).*\(64,\)"
    ):
        make_runner(folder)


def test_broadcastable_shard_is_not_accepted(folder: Path) -> None:
    """A (1,)-shaped q bias would broadcast into the fused qkv bias without the shape check."""
    edit_weights(
        folder, lambda s: s.update({"model.layers.0.self_attn.q_proj.bias": torch.ones(1)})
    )
    with pytest.raises(InvalidRequestError, match=r"q_proj.bias' has shape \(1,\)"):
        make_runner(folder)


def test_unexpected_tensor(folder: Path) -> None:
    edit_weights(
        folder, lambda s: s.update({"model.layers.0.self_attn.o_proj.bias": torch.ones(64)})
    )
    with pytest.raises(
        InvalidRequestError, match=r"o_proj\.bias' has no place in Qwen2ForCausalLM"
    ):
        make_runner(folder)


def test_folder_without_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    with pytest.raises(InvalidRequestError, match=r"no \*\.safetensors"):
        make_runner(folder)


def test_index_names_a_missing_shard(tmp_path: Path) -> None:
    from radixgen.runtime.model_loader.weights import iter_weights

    model = build_hf_model(tiny_config("llama_gqa"))
    folder = save_hf_model(model, tmp_path / "sharded", max_shard_size="60KB")
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(InvalidRequestError, match=f"missing: \\['{shards[-1].name}'\\]"):
        list(iter_weights(folder))


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"no config\.json"):
        ModelArchConfig.from_folder(tmp_path)


def test_missing_model_path() -> None:
    with pytest.raises(InvalidRequestError, match="does not exist"):
        resolve_model_path("/nonexistent/model")


def test_gguf_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported"):
        convert_gguf(path, tmp_path)
