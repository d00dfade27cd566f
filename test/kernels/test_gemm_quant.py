"""The quantized GEMM (gemm_quant.c): the dequantize-then-matmul oracle to float32 rounding for
every kept GGUF type and int8 weight-only, batch-invariant rows, exact embedding rows."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from radixgen.kernels.cpu import QuantLinearWeight, load_native_kernels
from radixgen.runtime.model_loader.gguf_blocks import (
    KEPT_TYPES,
    QuantPlanes,
    concat_rows,
    quantize_int8_per_channel,
    split_blocks,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from gguf_blocks import random_k_blocks, ref_dequantize  # independent block decoders

native = load_native_kernels()
pytestmark = pytest.mark.skipif(
    native is None or not native.has_quant_gemm, reason="CPU without AVX512-BF16"
)
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


def _pack(p: QuantPlanes, bias: torch.Tensor | None = None) -> QuantLinearWeight:
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
def test_k_quants_match_the_oracle_and_are_batch_invariant(qtype, m, n, k) -> None:
    planes, ref = _planes(qtype, n, k, seed=m + n)
    assert planes.fmt == K_FORMATS[qtype] and planes.d.dtype == np.float32
    packed = _pack(planes)
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
def test_matches_the_dequantize_then_matmul_oracle(qtype: Q, m, n, k, bias) -> None:
    planes, ref = _planes(qtype, n, k, seed=m + n + k)
    torch.manual_seed(m)
    x = torch.randn(m, k).bfloat16()
    b = torch.randn(n) if bias else None
    packed = _pack(planes, b)
    y32 = native.linear_quant(x, packed, torch.float32)
    assert y32.shape == (m, n) and y32.dtype == torch.float32
    _assert_float32_close(y32, x, ref, b)
    assert torch.equal(native.linear_quant(x, packed), y32.bfloat16())  # one rounding apart


def test_int8_weight_only_matches_its_oracle() -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((200, 576)) * 0.05).astype(np.float32)
    planes = quantize_int8_per_channel(w)
    deq = planes.dequantize()
    assert np.abs(deq - w).max() <= np.abs(w).max(axis=1).max() / 254 * 1.01  # half a step
    x = torch.randn(5, 576).bfloat16()
    _assert_float32_close(native.linear_quant(x, _pack(planes), torch.float32), x, deq)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_each_row_is_bitwise_the_same_alone_or_in_any_batch(qtype: Q) -> None:
    planes, _ = _planes(qtype, 200, 1536, seed=9)
    packed = _pack(planes)
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
def test_rows_lookup_is_the_bf16_rounded_dequantized_row(qtype: Q) -> None:
    planes, ref = _planes(qtype, 99, 64, seed=3)
    ids = torch.tensor([0, 98, 47, 48, 5, 5])
    rows = native.quant_rows(_pack(planes), ids)
    assert torch.equal(rows, torch.from_numpy(ref[ids.numpy()]).bfloat16())


def test_fused_rows_and_permuted_rows_stay_exact() -> None:
    a, ra = _planes(Q.Q4_1, 64, 64, seed=1)
    b, rb = _planes(Q.Q4_1, 32, 64, seed=2)
    order = np.random.default_rng(0).permutation(96)
    fused = concat_rows([a, b]).take_rows(order)
    assert np.array_equal(fused.dequantize(), np.concatenate([ra, rb])[order])
    with pytest.raises(AssertionError):
        concat_rows([a, _planes(Q.Q8_0, 32, 64, seed=3)[0]])


def test_strided_rows_empty_input_and_bad_shapes() -> None:
    planes, _ = _planes(Q.Q4_1, 96, 64, seed=2)
    packed = _pack(planes)
    wide = torch.randn(6, 100).bfloat16()
    view = wide[:, 10:74]
    assert torch.equal(
        native.linear_quant(view, packed), native.linear_quant(view.contiguous(), packed)
    )
    assert native.linear_quant(torch.empty(0, 64, dtype=torch.bfloat16), packed).shape == (0, 96)
    with pytest.raises(ValueError, match="multiple of 32"):
        split_blocks(np.zeros(4 * 18, np.uint8), int(Q.Q4_0), 4, 48)
