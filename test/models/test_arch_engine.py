"""The offline Engine (real scheduler and detokenizer processes, radix cache, chunked prefill)
serves the new architectures: greedy output ids equal transformers' `generate`, float32.

The tiny random models borrow the default model's tokenizer files (token ids below 512 decode
like any others); prompts go in as token ids.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from arch_harness import arch_config, hf_greedy
from model_harness import build_hf_model, random_ids, save_hf_model

import radixgen
from radixgen.runtime.model_loader.resolve import resolve_model_path

pytestmark = pytest.mark.slow  # starts an Engine (real processes)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.mark.parametrize("variant", ["gemma2", "qwen2_moe"])
def test_engine_greedy_equals_hf_generate(tmp_path: Path, variant: str) -> None:
    model = build_hf_model(arch_config(variant), seed=31)
    folder = save_hf_model(model, tmp_path / variant)
    default = Path(resolve_model_path(None))
    for name in _TOKENIZER_FILES:
        if (default / name).exists():
            shutil.copy(default / name, folder / name)
    # 40 tokens: past Gemma 2's window, and chunked (16) with the prefix cache reused
    base = random_ids(40, seed=7)
    prompts = [base, base[:25] + random_ids(9, seed=8), random_ids(6, seed=9)]
    want = [hf_greedy(model, p, 12) for p in prompts]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    with radixgen.Engine(
        str(folder),
        dtype="float32",
        grammar_backend="none",
        chunked_prefill_size=16,
        max_total_tokens=4096,
        log_level="warning",
    ) as engine:
        first = engine.generate(input_ids=prompts[0], sampling_params=params)
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert isinstance(first, dict) and isinstance(outs, list)
    assert first["output_ids"] == want[0]
    assert [o["output_ids"] for o in outs] == want
