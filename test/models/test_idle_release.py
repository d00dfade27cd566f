"""What the scheduler gives back when its queue empties (`ModelRunner.release_idle_memory`): the
native stack's kept workspace goes, and the steps after it compute bitwise the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import Session, build_hf_model, random_ids, save_hf_model, tiny_config

from radixgen.kernels.cpu import load_native_kernels
from radixgen.kernels.cpu.loader import GEMM_ENV
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs
from radixgen.utils import return_free_heap_to_os

native = load_native_kernels()


def _runner(folder: str) -> ModelRunner:
    args = ServerArgs.from_kwargs(dtype="bfloat16", max_total_tokens=4096)
    return ModelRunner(folder, args, context_length=1000)


def _steps(runner: ModelRunner, release: bool) -> list[torch.Tensor]:
    """A prefill, decodes beside an extend, single decodes; idle (released) between each when
    `release`."""
    s = Session(runner)
    a, b = s.new_request(), s.new_request()
    outs = s.step([(a, random_ids(40, 1)), (b, random_ids(9, 2))])
    for i in range(3):
        if release:
            runner.release_idle_memory()
        ids = random_ids(3, 10 + i)
        outs += s.step([(a, ids[:1]), (b, ids[1:])])
    if release:
        runner.release_idle_memory()
    outs += s.step([(a, random_ids(1, 20))])
    return outs


@pytest.mark.skipif(native is None or not native.has_bf16_gemm, reason="CPU without AVX512-BF16")
def test_release_drops_the_stack_workspace_and_keeps_the_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the dense bf16 layers on the native GEMM on AMX CPUs too (oneDNN's there by default)
    monkeypatch.setenv(GEMM_ENV, "1")
    save_hf_model(build_hf_model(tiny_config("llama_gqa"), seed=5), tmp_path)
    kept = _runner(str(tmp_path))
    want = _steps(kept, release=False)
    released = _runner(str(tmp_path))
    got = _steps(released, release=True)
    stack = released.model._stack
    assert stack is not None, "the native stack did not take this model"
    assert stack.work.numel() > 0  # the last step kept its workspace
    released.release_idle_memory()
    assert stack.work.numel() == 0
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert torch.equal(w, g), f"step {i}: max |diff| {float((w - g).abs().max())}"


def test_release_without_a_native_stack_is_harmless(tmp_path: Path) -> None:
    save_hf_model(build_hf_model(tiny_config("llama_gqa"), seed=5), tmp_path)
    runner = ModelRunner(
        str(tmp_path),
        ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096),
        context_length=1000,
    )
    runner.release_idle_memory()  # before any step: nothing built yet
    s = Session(runner)
    s.step([(s.new_request(), random_ids(5, 3))])
    assert runner.model._stack is None
    runner.release_idle_memory()
    return_free_heap_to_os()  # idempotent
