"""The model runner makes the native-or-torch choice once and every consumer gets that choice:
the fused layer ops, the linear layers (native GEMM or oneDNN), the attention backend, the logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import Session, build_hf_model, random_ids, save_hf_model, tiny_config

from radixgen.kernels.cpu import (
    PackedLinearWeight,
    has_amx_bf16,
    load_native_kernels,
    select_linear_gemm,
    select_native_kernels,
)
from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.layers.norm import RMSNorm
from radixgen.runtime.model_executor.logits_output import LogitsOutput
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_hf_model(tiny_config("llama_gqa"))
    return save_hf_model(model, tmp_path_factory.mktemp("llama_gqa"))


def _runner(folder: Path, dtype: str) -> ModelRunner:
    args = ServerArgs.from_kwargs(dtype=dtype, max_total_tokens=4096)
    return ModelRunner(str(folder), args, context_length=1000)


def _choices(runner: ModelRunner) -> tuple[set[int], set[int]]:
    """ids of the kernels the fused-op modules and the linear layers were handed."""
    fused = {
        id(m.native) for m in runner.model.modules() if isinstance(m, (RMSNorm, Attention, MLP))
    }
    gemm = {id(m.gemm) for m in runner.model.modules() if isinstance(m, Linear)}
    return fused, gemm | {id(runner.model.vocab.gemm)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_choice_reaches_every_consumer(folder: Path, dtype: str) -> None:
    if load_native_kernels() is None:
        pytest.skip("no native kernels on this machine")
    runner = _runner(folder, dtype)
    native = runner.native
    assert native is not None and native is select_native_kernels("cpu", runner.dtype)
    assert runner.attn_backend.native is native  # type: ignore[attr-defined]
    gemm = select_linear_gemm(native, runner.wide_rows)
    assert _choices(runner) == ({id(native)}, {id(gemm)})
    outputs: list[LogitsOutput] = []
    forward = runner.forward
    runner.forward = lambda batch: outputs.append(forward(batch)) or outputs[-1]  # type: ignore[method-assign]
    session = Session(runner)
    session.step([(session.new_request(), random_ids(6, 0))])
    # the logits use the kernels where they are bf16 (float32 logits are exact already)
    assert outputs[-1].native is (native if runner.dtype == torch.bfloat16 else None)


def test_float16_takes_the_torch_path_everywhere(folder: Path) -> None:
    """The native kernels have no float16 code: the runner chooses torch for every consumer
    (before the one choice, the fused ops were attached anyway and failed on the first step)."""
    runner = _runner(folder, "float16")
    assert runner.dtype == torch.float16 and runner.native is None
    assert runner.attn_backend.native is None  # type: ignore[attr-defined]
    assert _choices(runner) == ({id(None)}, {id(None)})
    session = Session(runner)
    slot = session.new_request()
    (prefill,) = session.step([(slot, random_ids(10, 0))])
    (decode,) = session.step([(slot, [5])])
    assert prefill.shape == (10, 512) and decode.shape == (1, 512)
    assert bool(torch.isfinite(prefill).all() and torch.isfinite(decode).all())


def test_selection_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    native = load_native_kernels()
    assert select_native_kernels("cpu", torch.float32) is native
    assert select_native_kernels("cpu", torch.float16) is None
    assert select_native_kernels("cuda", torch.bfloat16) is None
    assert select_linear_gemm(None) is None
    if native is not None and native.has_bf16_gemm and not has_amx_bf16():
        assert select_linear_gemm(native) is native
    else:  # no AVX512-BF16 GEMM, or AMX where oneDNN's tile path is faster
        assert select_linear_gemm(native) is None
    monkeypatch.setenv("RADIXGEN_NATIVE_GEMM", "0")
    assert select_linear_gemm(native) is None


def test_a_bf16_model_keeps_oneDNN_copies_for_wide_steps_beside_the_native_gemm(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = load_native_kernels()
    if native is None or not native.has_bf16_gemm:
        pytest.skip("no native bf16 GEMM on this CPU (AVX512-BF16)")
    monkeypatch.setenv("RADIXGEN_NATIVE_GEMM", "1")  # the native GEMM for every step
    monkeypatch.setenv("RADIXGEN_AMX_WIDE_ROWS", "0")
    plain = _runner(folder, "bfloat16")
    monkeypatch.delenv("RADIXGEN_NATIVE_GEMM")
    monkeypatch.setenv("RADIXGEN_AMX_WIDE_ROWS", "8")
    assert select_linear_gemm(native, 8) is native  # even on AMX: small steps stay native
    wide = _runner(folder, "bfloat16")
    assert wide.wide_rows == 8
    linears = [m for m in wide.model.modules() if isinstance(m, Linear)]
    assert all(isinstance(m.packed, PackedLinearWeight) for m in linears)
    assert all(isinstance(m.wide, torch.Tensor) and m.weight.numel() == 0 for m in linears)
    assert wide.model.vocab.wide_packed is not None and wide.model.vocab.wide_dense is None
    sp, sw = Session(plain), Session(wide)
    narrow = random_ids(5, seed=11)  # under the threshold: the native GEMM, the same bits
    assert torch.equal(
        sw.step([(sw.new_request(), narrow)])[0], sp.step([(sp.new_request(), narrow)])[0]
    )
    ids = random_ids(13, seed=12)  # a wide step: oneDNN on the copies, close but not the bits
    want = sp.step([(sp.new_request(), ids)])[0]
    got = sw.step([(sw.new_request(), ids)])[0]
    err = float((got - want).abs().max() / want.abs().max())
    assert 0 < err < 2e-2
    assert torch.equal(got.argmax(-1), want.argmax(-1))
