"""The quantized GEMM with int8 activations (gemm_quant_fma.h, RADIXGEN_CPU_ACT_QUANT=int8 or
int8x2): the activation-quantized oracle to float32 rounding, batch-invariant rows, and the flag
ignored where a variant or format has no such path; for every variant this CPU runs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_gemm_quant import Q, _pack, _planes, _variants

from radixgen.kernels.cpu import NativeBuildError, NativeKernels
from radixgen.kernels.cpu.bindings import ACT_FLAGS, QUANT_FORMATS
from radixgen.kernels.cpu.loader import ACT_QUANT_ENV, chosen_act_quant, load_kernels_for_isa

U4_TYPES = [Q.Q4_0, Q.Q4_1]
MODES = ["int8", "int8x2"]


@pytest.fixture(scope="module", params=_variants())
def native(request) -> NativeKernels:
    try:
        kernels = load_kernels_for_isa(request.param)
    except NativeBuildError as e:
        pytest.skip(str(e))
    if not kernels.has_quant_gemm:
        pytest.skip(f"variant {request.param} has no quantized GEMM")
    return kernels


def _needs_int8(native: NativeKernels, fmt: str = "u4") -> None:
    if fmt not in native.act_int8_formats:
        pytest.skip(f"variant {native.isa} has no int8-activation path for {fmt}")


def _quantize_rows(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The kernel's activation quantization, dequantized (float64 [m, k]): per row per 32 k,
    d1 = max|x| / 127 and q1 = x / d1 rounded to nearest even, in float32: d1 q1; int8x2 also
    r = x - q1 d1 (one rounding), d = d1 / 254, q2 = r / d rounded (clamped to 127): d (254 q1 +
    q2)."""
    xf = x.float().view(x.shape[0], -1, 32)
    d1 = xf.abs().amax(dim=2, keepdim=True) / 127.0
    q1 = torch.where(d1 > 0, torch.round(xf / torch.where(d1 > 0, d1, 1.0)), 0.0)
    assert float(q1.abs().max()) <= 127
    if mode == "int8":
        return (q1.double() * d1.double()).view(x.shape)
    r = (xf.double() - q1.double() * d1.double()).float()  # exact, then one rounding (an FMA)
    d = d1 / 254.0
    q2 = torch.where(d > 0, torch.round(r / torch.where(d > 0, d, 1.0)), 0.0).clamp(-127, 127)
    return ((254 * q1.double() + q2.double()) * d.double()).view(x.shape)


def _assert_oracle(y: torch.Tensor, x: torch.Tensor, w: np.ndarray, mode: str, bias=None) -> None:
    """Within float32 rounding of the float64 matmul of the quantized x and the weights."""
    xq = _quantize_rows(x, mode)
    wt = torch.from_numpy(w).double().t()
    ref = xq @ wt + (bias.double() if bias is not None else 0.0)
    scale = xq.abs() @ wt.abs()
    err = (y.double() - ref).abs()
    assert bool((err <= scale * 2e-6 + 1e-6).all()), float((err / (scale + 1e-6)).max())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("qtype", U4_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(
    ("m", "n", "k", "bias"),
    [(1, 48, 64, False), (3, 100, 96, True), (1, 130, 576, True), (32, 61, 1536, False),
     (64, 960, 576, True), (3, 1536, 32, False), (70, 200, 512, False)],
)  # fmt: skip
def test_matches_the_activation_quantized_oracle(native, qtype: Q, m, n, k, bias, mode) -> None:
    _needs_int8(native)
    planes, ref = _planes(qtype, n, k, seed=m + n + k)
    torch.manual_seed(m + k)
    x = (torch.randn(m, k) * torch.rand(m, 1) * 3).bfloat16()
    x[0, :32] = 0  # an all-zero group: d = 0
    b = torch.randn(n) if bias else None
    packed = _pack(native, planes, b)
    y32 = native.linear_quant(x, packed, torch.float32, act_quant=mode)
    assert y32.shape == (m, n) and y32.dtype == torch.float32
    _assert_oracle(y32, x, ref, mode, b)
    y16 = native.linear_quant(x, packed, act_quant=mode)
    assert torch.equal(y16, y32.bfloat16())  # one rounding apart
    # it is a different computation from the float path (which the existing oracle pins)
    assert not torch.equal(native.linear_quant(x, packed, torch.float32, act_quant="off"), y32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("qtype", U4_TYPES, ids=lambda q: q.name)
def test_each_row_is_bitwise_the_same_alone_or_in_any_batch(native, qtype: Q, mode) -> None:
    _needs_int8(native)
    planes, _ = _planes(qtype, 200, 1536, seed=9)
    packed = _pack(native, planes)
    torch.manual_seed(1)
    x = torch.randn(130, 1536).bfloat16()

    def run(rows: torch.Tensor) -> torch.Tensor:
        return native.linear_quant(rows, packed, torch.float32, act_quant=mode)

    alone = torch.cat([run(x[i : i + 1]) for i in range(130)])
    for m in (1, 2, 3, 4, 5, 8, 17, 32, 63, 64, 65, 130):
        assert torch.equal(run(x[:m]), alone[:m]), m
    assert torch.equal(run(torch.cat((x[:3], x)))[3:], alone)  # its place in a tile or block


@pytest.mark.parametrize("mode", MODES)
def test_strided_rows_match_contiguous(native, mode) -> None:
    _needs_int8(native)
    planes, _ = _planes(Q.Q4_1, 96, 128, seed=4)
    packed = _pack(native, planes)
    wide = torch.randn(5, 256).bfloat16()
    strided = native.linear_quant(wide[:, :128], packed, torch.float32, act_quant=mode)
    dense = native.linear_quant(wide[:, :128].contiguous(), packed, torch.float32, act_quant=mode)
    assert torch.equal(strided, dense)


def test_the_residual_step_is_closer_to_the_float_path(native) -> None:
    _needs_int8(native)
    planes, _ = _planes(Q.Q4_1, 200, 576, seed=6)
    packed = _pack(native, planes)
    x = torch.randn(8, 576).bfloat16()
    x[:, 7] *= 60  # an outlier channel, as RMSNorm outputs have
    exact = native.linear_quant(x, packed, torch.float32, act_quant="off")
    err = {
        mode: float(
            (native.linear_quant(x, packed, torch.float32, act_quant=mode) - exact).abs().max()
        )
        for mode in MODES
    }
    assert err["int8x2"] < err["int8"] / 50, err


def test_formats_without_the_path_ignore_the_flag(native) -> None:
    """Q8_0 (and every format on variants without the path) runs the float path as before."""
    planes, _ = _planes(Q.Q8_0, 100, 96, seed=2)
    packed = _pack(native, planes)
    x = torch.randn(3, 96).bfloat16()
    off = native.linear_quant(x, packed, torch.float32, act_quant="off")
    for mode in MODES:
        on = native.linear_quant(x, packed, torch.float32, act_quant=mode)
        assert torch.equal(on, off) == ("i8" not in native.act_int8_formats)
    assert native.quant_code(packed, "off") == QUANT_FORMATS["i8"]


def test_quant_code_and_modes(native) -> None:
    planes, _ = _planes(Q.Q4_1, 48, 64, seed=3)
    packed = _pack(native, planes)
    for mode in MODES:
        int8 = native.with_act_quant(mode)
        assert int8.isa == native.isa and int8.act_quant == mode
        has = "u4" in native.act_int8_formats
        assert int8.quant_code(packed) == QUANT_FORMATS["u4"] | (ACT_FLAGS[mode] if has else 0)
        assert int8.quant_code(packed, "off") == QUANT_FORMATS["u4"]
        assert int8.act_quant_active == (mode if native.act_int8_formats else "off")
    assert native.with_act_quant("off").act_quant_active == "off"
    mixed = native.with_act_quant("mixed")  # int8x2 for weights reading an RMSNorm output
    for reads_norm, mode in ((True, "int8x2"), (False, "int8")):
        w = replace(packed, reads_norm=reads_norm)
        assert mixed.quant_code(w) == native.with_act_quant(mode).quant_code(w)
    with pytest.raises(ValueError):
        native.with_act_quant("int4")


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    for mode in ("int8", "int8x2", "mixed"):
        monkeypatch.setenv(ACT_QUANT_ENV, mode)
        assert chosen_act_quant("avx2")[0] == mode
    monkeypatch.setenv(ACT_QUANT_ENV, "off")
    assert chosen_act_quant("avx2")[0] == "off"
    monkeypatch.setenv(ACT_QUANT_ENV, "bogus")  # logged and ignored
    assert chosen_act_quant("neon")[0] == "off"
