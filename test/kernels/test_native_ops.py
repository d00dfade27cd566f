"""Native CPU kernels against their torch references (the reference math of the model code)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixgen.kernels.cpu import load_native_kernels
from radixgen.runtime.model_executor.logits_output import refine_near_max

native = load_native_kernels()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler for the native kernels")

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rmsnorm_matches_torch(native, dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 96).to(dtype)
    residual = torch.randn(5, 96)
    weight = (torch.rand(96) + 0.5).to(dtype)
    ref_res = residual + x.float()
    ref = F.rms_norm(ref_res, (96,), eps=1e-5).to(dtype) * weight
    res = residual.clone()
    out = native.add_rmsnorm(x, res, weight, 1e-5)
    assert torch.equal(res, ref_res)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_kv_matches_torch(native, dtype):
    torch.manual_seed(1)
    n, h, hkv, d, slots = 4, 6, 2, 16, 40
    qkv = torch.randn(n, (h + 2 * hkv) * d).to(dtype)
    pos = torch.tensor([0, 3, 7, 11])
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(16).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    k_pool = torch.zeros(slots, hkv, d, dtype=dtype)
    v_pool = torch.zeros(slots, hkv, d, dtype=dtype)
    loc = torch.tensor([5, 9, 2, 30])
    q = native.rope_store_kv(qkv, pos, cos, sin, k_pool, v_pool, loc, h, hkv, d)

    def rotate(x):  # the model's torch path
        c, s = cos[pos].to(dtype).unsqueeze(1), sin[pos].to(dtype).unsqueeze(1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * c + torch.cat((-x2, x1), dim=-1) * s

    qr, kr, vr = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(q.float(), rotate(qr.view(n, h, d)).float(), rtol=tol, atol=tol)
    torch.testing.assert_close(
        k_pool[loc].float(), rotate(kr.view(n, hkv, d)).float(), rtol=tol, atol=tol
    )
    assert torch.equal(v_pool[loc], vr.reshape(n, hkv, d))
    untouched = [i for i in range(slots) if i not in loc.tolist()]
    assert not k_pool[untouched].any() and not v_pool[untouched].any()


def test_float32_projections_are_rounded_once_into_bf16(native):
    """Unrounded (float32) qkv / gate_up under a bf16 model: float32 math, one rounding."""
    torch.manual_seed(5)
    n, h, hkv, d = 3, 4, 2, 32
    qkv = torch.randn(n, (h + 2 * hkv) * d) * 3
    pos = torch.tensor([1, 4, 9])
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.outer(torch.arange(16).float(), inv).repeat(1, 2)
    cos, sin = emb.cos(), emb.sin()
    k_pool = torch.zeros(12, hkv, d, dtype=torch.bfloat16)
    v_pool = torch.zeros(12, hkv, d, dtype=torch.bfloat16)
    loc = torch.tensor([3, 0, 7])
    q = native.rope_store_kv(qkv, pos, cos, sin, k_pool, v_pool, loc, h, hkv, d)
    assert q.dtype == torch.bfloat16

    def rotate(x):
        c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
        return x * c + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1) * s

    qr, kr, vr = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    # the exact float32 rotation rounded once: at most half a bf16 ulp away (float32 slack)
    for got, want in ((q, rotate(qr.view(n, h, d))), (k_pool[loc], rotate(kr.view(n, hkv, d)))):
        err = (got.float() - want).abs()
        assert bool((err <= want.abs() * 2**-8 + 1e-6).all())
    assert torch.equal(v_pool[loc], vr.reshape(n, hkv, d).bfloat16())
    gate_up = torch.randn(n, 64) * 4
    out = native.silu_mul(gate_up, torch.bfloat16)
    gate, up = gate_up.split(32, dim=-1)
    want = F.silu(gate) * up
    assert out.dtype == torch.bfloat16
    assert bool(((out.float() - want).abs() <= want.abs() * 2**-8 + 1e-5).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(native, dtype):
    torch.manual_seed(2)
    gate_up = (torch.randn(3, 64) * 4).to(dtype)
    gate, up = gate_up.split(32, dim=-1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        native.silu_mul(gate_up).float(), (F.silu(gate) * up).float(), rtol=tol, atol=tol
    )


def test_near_max_rescoring_picks_the_exact_maximum(native):
    torch.manual_seed(3)
    hidden = torch.randn(6, 64).bfloat16()
    weight = torch.randn(500, 64).bfloat16()
    logits = F.linear(hidden, weight)  # bf16: rounded, ties at the top are common
    exact = hidden.float() @ weight.float().t()
    rows = [0, 2, 3, 5]
    got = native.greedy_refine(logits, hidden, weight, rows, 500)
    assert got == exact[rows].argmax(dim=-1).tolist()
    dense = logits[rows].float()
    native.refine_near_max(dense, hidden[rows].contiguous(), weight)
    assert dense.argmax(dim=-1).tolist() == got
    torch_dense = logits[rows].float()
    refine_near_max(torch_dense, hidden[rows], weight)
    assert torch_dense.argmax(dim=-1).tolist() == got
    # only candidates near the maximum change
    changed = (dense != logits[rows].float()).sum(dim=-1)
    assert bool((changed >= 1).all()) and bool((changed < 50).all())


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [R, V] -> int32 [R, ceil(V / 32)] packed bitmask (bit t % 32 of word t // 32)."""
    r, v = allowed.shape
    words = -(-v // 32)
    bits = torch.zeros(r, words * 32, dtype=torch.int64)
    bits[:, :v] = allowed.long()
    packed = (bits.view(r, words, 32) << torch.arange(32)).sum(dim=-1)
    return packed.to(torch.int64).where(packed < 2**31, packed - 2**32).to(torch.int32)


def test_masked_greedy_picks_the_exact_maximum_among_allowed_tokens(native):
    torch.manual_seed(4)
    hidden = torch.randn(5, 64).bfloat16()
    weight = torch.randn(500, 64).bfloat16()  # 500: a vocabulary that is not a multiple of 16
    logits = F.linear(hidden, weight)
    exact = hidden.float() @ weight.float().t()
    rows = [0, 1, 3, 4]
    allowed = torch.rand(len(rows), 500) < 0.2
    allowed[1] = False
    allowed[1, [7, 499]] = True  # only two tokens, one in the tail past the last 16-lane block
    allowed[2] = False  # nothing allowed: token 0, as argmax over all -inf
    got = native.greedy_refine(logits, hidden, weight, rows, 500, _pack(allowed))
    masked = exact[rows].masked_fill(~allowed, float("-inf"))
    want = masked.argmax(dim=-1).tolist()
    want[2] = 0
    assert got == want
    # the torch fallback (LogitsOutput without native kernels) agrees
    from radixgen.runtime.model_executor.logits_output import LogitsOutput

    out = LogitsOutput(logits, hidden, weight, 500, None)
    fallback = out.greedy(rows, _pack(allowed))
    assert [g for i, g in enumerate(fallback) if i != 2] == [
        w for i, w in enumerate(want) if i != 2
    ]


def test_float32_argmax_is_torchs_with_ties_nans_infs_and_masks(native):
    """The quantized head's greedy rows: torch's argmax (first maximum, first NaN), and under a
    grammar mask the argmax of the row with the disallowed tokens at -inf."""
    torch.manual_seed(6)
    v, ld = 500, 512  # not a multiple of 16; rows padded past the vocabulary
    logits = torch.randn(9, ld)
    logits[:, v:] = 1e9  # padding the argmax must not read
    logits[1, [3, 40, 41, 480]] = 7.0  # ties: the first one wins, in a lane or across lanes
    logits[2, [17, 33]] = 7.0  # ties in two different lanes: the lower id
    logits[3] = float("-inf")  # every value -inf: token 0
    logits[4, [100, 300]] = float("nan")  # the first NaN wins
    logits[5, 497] = 50.0  # the maximum in the scalar tail
    logits[6, 2] = float("inf")
    logits[7, 150:] = float("nan")
    logits[7, 149] = 1e6
    rows = list(range(9))
    want = logits[:, :v].argmax(dim=-1)
    assert torch.equal(native.argmax(logits, rows, v), want)
    picked = [8, 4, 1, 5]
    assert torch.equal(native.argmax(logits, picked, v), want[picked])
    allowed = torch.rand(4, v) < 0.3
    allowed[0] = False  # nothing allowed: token 0
    allowed[1, 300] = True
    allowed[1, 100] = False  # the allowed NaN wins, the disallowed one not
    allowed[2] = False
    allowed[2, [3, 41, 480]] = True  # ties among allowed tokens
    masked = logits[picked, :v].masked_fill(~allowed, float("-inf"))
    got = native.argmax(logits, picked, v, _pack(allowed))
    assert torch.equal(got, masked.argmax(dim=-1))
    assert got.tolist()[:3] == [0, 300, 3]


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_vector_body_and_scalar_tail(native, dtype):
    torch.manual_seed(5)
    gate_up = (torch.randn(4, 80) * 6).to(dtype)  # I = 40: two 16-lane blocks and a tail of 8
    gate, up = gate_up.split(40, dim=-1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        native.silu_mul(gate_up).float(), (F.silu(gate) * up).float(), rtol=tol, atol=tol
    )
