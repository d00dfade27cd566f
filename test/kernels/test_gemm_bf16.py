"""The native bf16 GEMM of the linear layers: exact to bf16 rounding, batch-invariant per row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixgen.kernels.cpu import PackedLinearWeight, load_native_kernels, select_linear_gemm
from radixgen.runtime.layers.linear import Linear

native = load_native_kernels()
pytestmark = pytest.mark.skipif(
    native is None or not native.has_bf16_gemm, reason="CPU without AVX512-BF16 (oneDNN serves)"
)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


@pytest.mark.parametrize(
    ("m", "n", "k", "bias"),
    [(1, 48, 64, False), (9, 100, 77, True), (64, 960, 576, False), (70, 50, 1536, True)],
)
def test_matches_float64_reference_to_bf16_rounding(m, n, k, bias):
    torch.manual_seed(m + n + k)
    x = torch.randn(m, k).bfloat16()
    w = (torch.randn(n, k) * 0.1).bfloat16()
    b = torch.randn(n).bfloat16() if bias else None
    y = native.linear_bf16(x, native.pack_linear(w, b))
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref = _reference(x, w, b)
    # float32 accumulation, then one rounding to bf16 (half an ulp: 2^-9 relative)
    err = (y.double() - ref).abs()
    assert bool((err <= ref.abs() * 2**-8 + 1e-3).all()), float(err.max())


def test_float32_output_is_the_unrounded_accumulator():
    torch.manual_seed(4)
    x = torch.randn(11, 96).bfloat16()
    w = (torch.randn(60, 96) * 0.1).bfloat16()
    b = torch.randn(60).bfloat16()
    packed = native.pack_linear(w, b)
    y32 = native.linear_bf16(x, packed, torch.float32)
    assert y32.dtype == torch.float32
    assert torch.equal(y32.bfloat16(), native.linear_bf16(x, packed))  # one rounding apart
    assert float((y32.double() - _reference(x, w, b)).abs().max()) < 1e-4


def test_each_row_is_bitwise_the_same_alone_or_in_any_batch():
    torch.manual_seed(1)
    w = (torch.randn(200, 1536) * 0.05).bfloat16()
    packed = native.pack_linear(w)
    x = torch.randn(130, 1536).bfloat16()
    alone = torch.cat([native.linear_bf16(x[i : i + 1], packed) for i in range(130)])
    for m in (2, 7, 8, 9, 63, 64, 65, 130):
        assert torch.equal(native.linear_bf16(x[:m], packed), alone[:m]), m
    # a row's place inside a register tile or a 64-row block does not matter either
    shifted = native.linear_bf16(torch.cat((x[:5], x)), packed)
    assert torch.equal(shifted[5:], alone)


def test_strided_rows_and_empty_input():
    torch.manual_seed(2)
    w = torch.randn(96, 64).bfloat16()
    packed = native.pack_linear(w)
    wide = torch.randn(6, 100).bfloat16()
    view = wide[:, 10:74]  # row stride 100, not 64
    assert torch.equal(
        native.linear_bf16(view, packed), native.linear_bf16(view.contiguous(), packed)
    )
    transposed = torch.randn(64, 6).bfloat16().t()  # column stride != 1
    assert torch.equal(
        native.linear_bf16(transposed, packed), native.linear_bf16(transposed.contiguous(), packed)
    )
    assert native.linear_bf16(torch.empty(0, 64, dtype=torch.bfloat16), packed).shape == (0, 96)


def test_linear_module_uses_the_native_gemm_unless_disabled(monkeypatch):
    torch.manual_seed(3)
    layer = Linear(576, 192, bias=True).to(torch.bfloat16)
    x = torch.randn(4, 576).bfloat16()
    monkeypatch.setenv("RADIXGEN_NATIVE_GEMM", "1")  # native on AMX CPUs too (oneDNN's default)
    layer.prepack(select_linear_gemm(native))
    assert isinstance(layer.packed, PackedLinearWeight)
    torch.testing.assert_close(layer(x).float(), F.linear(x, layer.weight, layer.bias).float(), rtol=2**-7, atol=2e-2)  # fmt: skip
    monkeypatch.setenv("RADIXGEN_NATIVE_GEMM", "0")
    layer.prepack(select_linear_gemm(native))
    assert isinstance(layer.packed, torch.Tensor)  # oneDNN's blocked weight
    torch.testing.assert_close(layer(x).float(), F.linear(x, layer.weight, layer.bias).float(), rtol=2**-7, atol=2e-2)  # fmt: skip
