"""The model runner with `--attention-backend triton` gives the torch backend's logits, and the
CPU path never loads triton.

The parity tests are `gpu` tests that also run on CPU under Triton's interpreter
(scripts/test_triton_cpu.sh); on CPU the runner keeps its native GEMMs and fused rotary + KV
store, so only attention differs between the two runners.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from model_harness import (
    Session,
    build_hf_model,
    make_runner,
    random_ids,
    save_hf_model,
    tiny_config,
)

from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.runtime.model_executor.resolution import resolve_attention_backend
from radixgen.server_args import ServerArgs

# (request, new tokens) per step: prefill, a chunk on a cached prefix, decode-only steps, and
# mixed steps (a prefill next to decode rows), past the decode kernel's 256-key split size
SCHEDULE = [
    [(0, 20)],
    [(0, 12)],
    [(0, 1)],
    [(0, 1), (1, 16), (2, 1)],
    [(0, 1), (1, 250), (2, 13)],
    [(0, 1), (1, 1), (2, 1)],
    [(2, 1), (0, 1), (1, 1)],
]
TOLERANCE = 2e-5  # float32: the two backends differ in summation order only


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folders = {}
    for seed, variant in enumerate(("llama_gqa", "mistral_window")):
        model = build_hf_model(tiny_config(variant), seed=seed)
        folders[variant] = save_hf_model(model, tmp_path_factory.mktemp(variant))
    return folders


def triton_runner(folder: Path) -> ModelRunner:
    args = ServerArgs.from_kwargs(
        dtype="float32", max_total_tokens=4096, attention_backend="triton"
    )
    return ModelRunner(str(folder), args, context_length=1000)


@pytest.mark.gpu
@pytest.mark.triton_interpret
@pytest.mark.parametrize("variant", ["llama_gqa", "mistral_window"])
def test_triton_backend_matches_torch(tiny_models: dict[str, Path], variant: str) -> None:
    folder = tiny_models[variant]
    runner = triton_runner(folder)
    assert type(runner.attn_backend).__name__ == "TritonAttentionBackend"
    ours, oracle = Session(runner), Session(make_runner(folder, native=False))
    n_req = 3
    totals = [sum(n for step in SCHEDULE for r, n in step if r == i) for i in range(n_req)]
    seqs = [random_ids(t, seed=200 + i) for i, t in enumerate(totals)]
    slots = [(ours.new_request(), oracle.new_request()) for _ in range(n_req)]
    done = [0] * n_req
    for step in SCHEDULE:
        chunks = [(r, seqs[r][done[r] : done[r] + n]) for r, n in step]
        got = ours.step([(slots[r][0], toks) for r, toks in chunks])
        want = oracle.step([(slots[r][1], toks) for r, toks in chunks])
        for (r, n), a, b in zip(step, got, want, strict=True):
            torch.testing.assert_close(a, b, atol=TOLERANCE * b.abs().max().item(), rtol=0)
            done[r] += n


def test_triton_on_cpu_is_refused_without_the_interpreter(monkeypatch: Any) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(InvalidRequestError, match="triton needs a CUDA device"):
        resolve_attention_backend("triton", "cpu")
    with pytest.raises(InvalidRequestError, match="flashinfer needs a CUDA device"):
        resolve_attention_backend("flashinfer", "cpu")
    assert resolve_attention_backend("auto", "cpu") == "torch"


def test_cpu_path_never_imports_triton_or_flashinfer(tiny_models: dict[str, Path]) -> None:
    """A CPU model runner (default backend) loads and runs a step without either package."""
    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from model_harness import Session, make_runner
session = Session(make_runner({str(tiny_models["llama_gqa"])!r}))
slot = session.new_request()
session.step([(slot, [5, 6, 7])])
session.step([(slot, [8])])
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {{"triton", "flashinfer"}})))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
