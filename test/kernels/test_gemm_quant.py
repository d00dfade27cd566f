"""The quantized GEMM (gemm_quant.c): the dequantize-then-matmul oracle to float32 rounding for
every kept GGUF type and int8 weight-only, batch-invariant rows, exact embedding rows; for every
instruction-set variant this CPU runs (isa.py: the AVX512-BF16 kernel and gemm_quant_fma.h's
AVX-512F and AVX2 ones), the others skipped with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from radixgen.kernels.cpu import NativeBuildError, NativeKernels, QuantLinearWeight, build
from radixgen.kernels.cpu.bindings import QUANT_FORMATS
from radixgen.kernels.cpu.isa import BY_NAME, VARIANTS, why_not_runnable
from radixgen.kernels.cpu.loader import load_kernels_for_isa
from radixgen.runtime.model_loader.gguf_blocks import (
    KEPT_TYPES,
    QuantPlanes,
    concat_rows,
    quantize_int8_per_channel,
    split_blocks,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from gguf_blocks import random_k_blocks, ref_dequantize  # independent block decoders


def _variants() -> list:
    """Every variant, those this CPU cannot run skipped with why_not_runnable's reason (it names
    the missing CPU features, or the other architecture)."""
    params = []
    for v in VARIANTS:
        reason = why_not_runnable(v.name)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(v.name, marks=marks, id=v.name))
    return params


@pytest.fixture(scope="module", params=_variants())
def native(request) -> NativeKernels:
    try:
        kernels = load_kernels_for_isa(request.param)
    except NativeBuildError as e:
        pytest.skip(str(e))
    if not kernels.has_quant_gemm:
        pytest.skip(f"variant {request.param} has no quantized GEMM")
    return kernels


Q = gguf.GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]  # the gguf package quantizes these; Q4_K blocks are drawn


def _planes(qtype: Q, n: int, k: int, seed: int) -> tuple[QuantPlanes, np.ndarray]:
    """Random weights quantized by the gguf package: (our planes, the reference decode)."""
    rng = np.random.default_rng(seed)
    if qtype in (Q.Q4_K, Q.Q6_K):
        raw = random_k_blocks(qtype, n, k, rng)
        return split_blocks(raw, int(qtype), n, k), ref_dequantize(raw, qtype, k)
    if qtype == Q.Q5_K:  # random bytes are a valid block once d and dmin are finite
        raw = rng.integers(0, 256, (n, k // 256, 176), dtype=np.uint8)
        scales = (rng.standard_normal((n, k // 256, 2)) * 0.01).astype(np.float16)
        raw[..., 0:4] = scales.view(np.uint8).reshape(n, k // 256, 4)
        raw = raw.reshape(n, -1)
        ref = gguf.quants.dequantize(raw, qtype).reshape(n, k).astype(np.float32)
        return split_blocks(raw, int(qtype), n, k), ref
    w = (rng.standard_normal((n, k)) * 0.05 + rng.standard_normal((n, 1)) * 0.02).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)
    return split_blocks(raw, int(qtype), n, k), ref_dequantize(raw, qtype, k)


def _pack(
    native: NativeKernels, p: QuantPlanes, bias: torch.Tensor | None = None
) -> QuantLinearWeight:
    m = None if p.m is None else torch.from_numpy(p.m)
    return native.pack_quant(torch.from_numpy(p.q), torch.from_numpy(p.d), m, p.fmt, bias)


def _oracle(x: torch.Tensor, w: np.ndarray, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ torch.from_numpy(w).double().t()
    return y + bias.double() if bias is not None else y


def _assert_float32_close(y: torch.Tensor, x: torch.Tensor, w: np.ndarray, bias=None) -> None:
    """Within float32 accumulation error: relative to sum |x| |w| per output (bf16 rounding of
    the weights would be ~2^-9 of it, a thousand times more)."""
    scale = x.double().abs() @ torch.from_numpy(np.abs(w)).double().t()
    err = (y.double() - _oracle(x, w, bias)).abs()
    assert bool((err <= scale * 2e-6 + 1e-6).all()), float((err / (scale + 1e-6)).max())


K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
K_FORMATS = {Q.Q4_K: "u4f", Q.Q5_K: "i8m", Q.Q6_K: "i8h"}


@pytest.mark.parametrize("qtype", [*TYPES, *K_TYPES], ids=lambda q: q.name)
def test_planes_decode_to_the_reference(qtype: Q) -> None:
    planes, ref = _planes(qtype, 37, 512 if qtype in K_TYPES else 96, seed=1)
    assert np.array_equal(planes.dequantize(), ref)
    assert set(KEPT_TYPES) == {int(t) for t in (*TYPES, *K_TYPES)}


@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 48, 256), (2, 100, 512), (5, 61, 1536), (70, 200, 512)]
)
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_k_quants_match_the_oracle_and_are_batch_invariant(native, qtype, m, n, k) -> None:
    planes, ref = _planes(qtype, n, k, seed=m + n)
    assert planes.fmt == K_FORMATS[qtype] and planes.d.dtype == np.float32
    packed = _pack(native, planes)
    x = torch.randn(m, k).bfloat16()
    y = native.linear_quant(x, packed, torch.float32)
    _assert_float32_close(y, x, ref)
    alone = torch.cat([native.linear_quant(x[i : i + 1], packed, torch.float32) for i in range(m)])
    assert torch.equal(alone, y)
    assert torch.equal(
        native.quant_rows(packed, torch.tensor([0, n - 1])),
        torch.from_numpy(ref[[0, n - 1]]).bfloat16(),
    )


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(
    ("m", "n", "k", "bias"),
    [(1, 48, 64, False), (2, 100, 96, True), (3, 130, 576, False), (9, 61, 1536, True),
     (70, 960, 576, False)],
)  # fmt: skip
def test_matches_the_dequantize_then_matmul_oracle(native, qtype: Q, m, n, k, bias) -> None:
    planes, ref = _planes(qtype, n, k, seed=m + n + k)
    torch.manual_seed(m)
    x = torch.randn(m, k).bfloat16()
    b = torch.randn(n) if bias else None
    packed = _pack(native, planes, b)
    y32 = native.linear_quant(x, packed, torch.float32)
    assert y32.shape == (m, n) and y32.dtype == torch.float32
    _assert_float32_close(y32, x, ref, b)
    assert torch.equal(native.linear_quant(x, packed), y32.bfloat16())  # one rounding apart


def test_int8_weight_only_matches_its_oracle(native) -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((200, 576)) * 0.05).astype(np.float32)
    planes = quantize_int8_per_channel(w)
    deq = planes.dequantize()
    assert np.abs(deq - w).max() <= np.abs(w).max(axis=1).max() / 254 * 1.01  # half a step
    x = torch.randn(5, 576).bfloat16()
    _assert_float32_close(native.linear_quant(x, _pack(native, planes), torch.float32), x, deq)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_each_row_is_bitwise_the_same_alone_or_in_any_batch(native, qtype: Q) -> None:
    planes, _ = _planes(qtype, 200, 1536, seed=9)
    packed = _pack(native, planes)
    torch.manual_seed(1)
    x = torch.randn(130, 1536).bfloat16()
    alone = torch.cat(
        [native.linear_quant(x[i : i + 1], packed, torch.float32) for i in range(130)]
    )
    for m in (2, 3, 4, 5, 8, 12, 16, 17, 63, 64, 65, 130):
        assert torch.equal(native.linear_quant(x[:m], packed, torch.float32), alone[:m]), m
    shifted = native.linear_quant(torch.cat((x[:3], x)), packed, torch.float32)
    assert torch.equal(shifted[3:], alone)  # a row's place in a tile or block does not matter


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_rows_lookup_is_the_bf16_rounded_dequantized_row(native, qtype: Q) -> None:
    planes, ref = _planes(qtype, 99, 64, seed=3)
    ids = torch.tensor([0, 98, 47, 48, 5, 5])
    rows = native.quant_rows(_pack(native, planes), ids)
    assert torch.equal(rows, torch.from_numpy(ref[ids.numpy()]).bfloat16())


def test_fused_rows_and_permuted_rows_stay_exact() -> None:
    a, ra = _planes(Q.Q4_1, 64, 64, seed=1)
    b, rb = _planes(Q.Q4_1, 32, 64, seed=2)
    order = np.random.default_rng(0).permutation(96)
    fused = concat_rows([a, b]).take_rows(order)
    assert np.array_equal(fused.dequantize(), np.concatenate([ra, rb])[order])
    with pytest.raises(AssertionError):
        concat_rows([a, _planes(Q.Q8_0, 32, 64, seed=3)[0]])


def test_strided_rows_empty_input_and_bad_shapes(native) -> None:
    planes, _ = _planes(Q.Q4_1, 96, 64, seed=2)
    packed = _pack(native, planes)
    wide = torch.randn(6, 100).bfloat16()
    view = wide[:, 10:74]
    assert torch.equal(
        native.linear_quant(view, packed), native.linear_quant(view.contiguous(), packed)
    )
    assert native.linear_quant(torch.empty(0, 64, dtype=torch.bfloat16), packed).shape == (0, 96)
    with pytest.raises(ValueError, match="multiple of 32"):
        split_blocks(np.zeros(4 * 18, np.uint8), int(Q.Q4_0), 4, 48)


@pytest.mark.parametrize("qtype", [*TYPES, *K_TYPES, "int8"], ids=lambda q: getattr(q, "name", q))
def test_every_format_row_by_row_equals_every_batch(native, qtype) -> None:
    """All five packed formats (Q4_0 / Q4_1 u4, Q8_0 and int8 i8, Q4_K u4f, Q5_K i8m, Q6_K i8h),
    100 outputs (a partial panel), a bias, rows read with a stride wider than k: each row alone
    is the oracle to float32 rounding, and every batch of 1 to 131 rows gives the same bits in
    float32 and the bf16 rounding of them."""
    n, k = 100, 512
    if qtype == "int8":
        rng = np.random.default_rng(7)
        planes = quantize_int8_per_channel((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
        ref = planes.dequantize()
    else:
        planes, ref = _planes(qtype, n, k, seed=11)
    torch.manual_seed(2)
    b = torch.randn(n)
    packed = _pack(native, planes, b)
    x = torch.randn(131, k + 40).bfloat16()[:, 16 : 16 + k]
    assert x.stride(0) == k + 40
    alone = torch.cat(
        [native.linear_quant(x[i : i + 1], packed, torch.float32) for i in range(len(x))]
    )
    _assert_float32_close(alone, x, ref, b)
    for m in (1, 2, 3, 4, 5, 8, 9, 17, 33, 64, 65, 131):  # each path, tile and block edge
        assert torch.equal(native.linear_quant(x[:m], packed, torch.float32), alone[:m]), m
        assert torch.equal(native.linear_quant(x[:m], packed), alone[:m].bfloat16()), m
    tail = native.linear_quant(x[5:], packed, torch.float32)
    assert torch.equal(tail, alone[5:])  # a row's place in a tile or block does not matter


# --- the aarch64 NEON variant, cross-compiled and run under qemu-user ---------------------------

HARNESS = Path(__file__).parent / "native_harness" / "qgemm_harness.c"
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64-static", "/usr/aarch64-linux-gnu"
CROSS_SIZES = (1, 2, 3, 4, 5, 8, 9, 17, 65)  # batches (prefixes) besides every row alone


@pytest.fixture(scope="module")
def neon_harness(tmp_path_factory) -> Path:
    """qgemm_harness.c with gemm_quant.c built for the neon variant (its -march level, warnings
    as errors), to run under qemu-user."""
    missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    if missing or not Path(SYSROOT).is_dir():
        pytest.skip(
            f"needs {', '.join(missing) or SYSROOT} to check the aarch64 variant (Debian: "
            "apt-get install gcc-aarch64-linux-gnu qemu-user-static)"
        )
    out = tmp_path_factory.mktemp("neon") / "qgemm_harness"
    cmd = [CROSS_CC, *BY_NAME["neon"].cflags, "-O3", "-fopenmp", "-std=c11", "-ffp-contract=fast",
           "-Wall", "-Wextra", "-Werror", str(HARNESS), str(build.SOURCE_DIR / "gemm_quant.c"),
           str(build.SOURCE_DIR / "team.c"),
           "-o", str(out), "-lm"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("qtype", [*TYPES, *K_TYPES, "int8"], ids=lambda q: getattr(q, "name", q))
def test_neon_variant_under_qemu_is_the_oracle_and_batch_invariant(neon_harness, qtype, tmp_path):
    """The aarch64 build of gemm_quant_fma.h on the five formats: every row alone within float32
    rounding of the float64 oracle computed here, batches of 1-70 rows bitwise equal to it,
    bf16 output its rounding (100 outputs, a bias, rows with a stride wider than k)."""
    n, k, m, ldx = 100, 512, 70, 540
    if qtype == "int8":
        rng = np.random.default_rng(7)
        planes = quantize_int8_per_channel((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
        ref = planes.dequantize()
    else:
        planes, ref = _planes(qtype, n, k, seed=13)
    torch.manual_seed(3)
    bias = torch.randn(n)
    wide = torch.randn(m, ldx).bfloat16()
    d = np.ascontiguousarray(planes.d)
    header = np.array(
        [QUANT_FORMATS[planes.fmt], n, k, m, ldx, 1, planes.m is not None, d.size, d.itemsize],
        dtype="<i8",
    )
    parts = [header.tobytes(), np.ascontiguousarray(planes.q).tobytes(), d.tobytes()]
    if planes.m is not None:
        parts.append(np.ascontiguousarray(planes.m, dtype=d.dtype).tobytes())
    parts += [bias.numpy().astype("<f4").tobytes(), wide.view(torch.int16).numpy().tobytes()]
    (tmp_path / "in").write_bytes(b"".join(parts))
    proc = subprocess.run(
        [QEMU, "-L", SYSROOT, str(neon_harness), str(tmp_path / "in"), str(tmp_path / "out"),
         *map(str, CROSS_SIZES)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "2"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    raw = (tmp_path / "out").read_bytes()
    floats = np.frombuffer(raw, dtype="<f4", count=(m + sum(CROSS_SIZES)) * n)
    alone = torch.from_numpy(floats[: m * n].copy()).view(m, n)
    x = wide[:, :k]
    _assert_float32_close(alone, x, ref, bias)
    at = m * n
    for size in CROSS_SIZES:
        batch = torch.from_numpy(floats[at : at + size * n].copy()).view(size, n)
        assert torch.equal(batch, alone[:size]), size
        at += size * n
    y_bf16 = np.frombuffer(raw, dtype="<i2", offset=at * 4, count=m * n).copy()
    assert torch.equal(torch.from_numpy(y_bf16).view(m, n).view(torch.bfloat16), alone.bfloat16())
