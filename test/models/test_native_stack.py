"""The native decoder stack (runtime/models/native_stack.py) computes bitwise what the per-layer
path computes, on every layer kind it takes, and leaves the others to that path.

Each case runs the same mixed steps (a prefill, then decode rows beside a two-token extend,
then single decodes) through two runners, one with RADIXGEN_NATIVE_STACK=0, and compares every
logit exactly: the stack calls the same kernels in the same order, so any difference is a bug
(a wrong table word, a wrong buffer, a missed step).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import Session, build_hf_model, random_ids, save_hf_model, tiny_config

from radixgen.kernels.cpu import load_native_kernels
from radixgen.kernels.cpu.loader import GEMM_ENV
from radixgen.kernels.step_cancel import CancelFlag, StepCancelled
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.runtime.models.native_stack import DISABLE_ENV
from radixgen.server_args import ServerArgs

native = load_native_kernels()
pytestmark = pytest.mark.skipif(native is None, reason="no native CPU kernels")
# dense bf16 layers run in the stack on the native bf16 GEMM; quantized ones on any variant
NEEDS_BF16_GEMM = pytest.mark.skipif(
    native is None or not native.has_bf16_gemm, reason="CPU without AVX512-BF16 (dense layers)"
)
NEEDS_QUANT_GEMM = pytest.mark.skipif(
    native is None or not native.has_quant_gemm, reason="no quantized GEMM in this variant"
)


def _runner(folder: str, stack: bool, monkeypatch: pytest.MonkeyPatch, **kw) -> ModelRunner:
    monkeypatch.setenv(DISABLE_ENV, "1" if stack else "0")
    # the dense bf16 layers on the native GEMM on AMX CPUs too (oneDNN's there by default)
    monkeypatch.setenv(GEMM_ENV, "1")
    args = ServerArgs.from_kwargs(dtype="bfloat16", max_total_tokens=4096, **kw)
    return ModelRunner(folder, args, context_length=1000)


def _steps(runner: ModelRunner, vocab: int) -> list[torch.Tensor]:
    """Logits of: two prefills (one past a sliding window), decode rows beside a two-token
    extend, then single decodes."""
    s = Session(runner)
    a, b = s.new_request(), s.new_request()
    outs = s.step([(a, random_ids(40, 1)), (b, random_ids(9, 2))])
    for i in range(4):
        ids = random_ids(3, 10 + i)
        outs += s.step([(a, ids[:1]), (b, ids[1:])])
    for i in range(3):
        outs += s.step([(a, random_ids(1, 20 + i))])
    assert all(o.shape[-1] >= vocab for o in outs)
    return outs


def _compare(folder: str, monkeypatch: pytest.MonkeyPatch, vocab: int, **kw) -> ModelRunner:
    per_layer = _runner(folder, False, monkeypatch, **kw)
    want = _steps(per_layer, vocab)
    assert per_layer.model._stack is None
    stacked = _runner(folder, True, monkeypatch, **kw)
    got = _steps(stacked, vocab)
    assert stacked.model._stack is not None, "the stack did not take this model"
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert torch.equal(w, g), f"chunk {i}: max |diff| {float((w - g).abs().max())}"
    return stacked


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory) -> dict[str, str]:
    out = {}
    for variant in ("llama_gqa", "llama_mha_bias", "mistral_window", "qwen2_window_layers"):
        folder = tmp_path_factory.mktemp(variant)
        save_hf_model(build_hf_model(tiny_config(variant), seed=5), Path(folder))
        out[variant] = str(folder)
    return out


@NEEDS_BF16_GEMM
@pytest.mark.parametrize(
    "variant", ["llama_gqa", "llama_mha_bias", "mistral_window", "qwen2_window_layers"]
)
def test_stack_equals_the_per_layer_path_bitwise(variant, tiny_folders, monkeypatch):
    _compare(tiny_folders[variant], monkeypatch, 512)


@NEEDS_QUANT_GEMM
@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
def test_stack_over_a_quantized_kv_pool_and_int8_weights(kv, tiny_folders, monkeypatch):
    _compare(
        tiny_folders["llama_mha_bias"], monkeypatch, 512, quantization="w8a16", kv_cache_dtype=kv
    )


@NEEDS_QUANT_GEMM
def test_default_model_kept_quantized_runs_in_the_stack(default_model_folder, monkeypatch):
    runner = _compare(default_model_folder, monkeypatch, 49152, quantization="gguf")
    assert runner.quantization == "gguf"


def test_layers_the_stack_does_not_cover_stay_on_the_per_layer_path(tiny_folders, monkeypatch):
    float32 = ModelRunner(
        tiny_folders["llama_gqa"],
        ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096),
        context_length=1000,
    )
    s = Session(float32)
    s.step([(s.new_request(), random_ids(5, 3))])
    assert float32.model._stack is None  # the torch GEMM, not the native one


@NEEDS_QUANT_GEMM
@pytest.mark.parametrize("stack", [True, False], ids=["stack", "per_layer"])
def test_a_set_cancel_flag_stops_the_forward_and_a_clear_one_changes_nothing(
    stack, tiny_folders, monkeypatch
):
    """A step cut for an interactive arrival (runtime/scheduler/step_interrupt.py): the native
    stack reads the flag through its address, the per-layer path in Python."""
    runner = _runner(tiny_folders["llama_mha_bias"], stack, monkeypatch, quantization="w8a16")
    s = Session(runner)
    a, b, c = s.new_request(), s.new_request(), s.new_request()
    ids = random_ids(12, 4)
    flag = CancelFlag()
    flag.set()
    with pytest.raises(StepCancelled):
        s.step([(a, ids)], cancel=flag)
    flag.clear()
    got = s.step([(b, ids)], cancel=flag)
    want = s.step([(c, ids)])
    assert (runner.model._stack is not None) == stack
    assert torch.equal(got[0], want[0])
