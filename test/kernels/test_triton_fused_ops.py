"""RadixGen's Triton layer kernels (add + RMSNorm, SiLU-mul, rotary + KV store, grammar bitmask)
against torch references.

`gpu` tests: natively on a CUDA device (with larger batches, and offsets past 2^31 elements); on
CPU under Triton's interpreter with small shapes (`bash scripts/test_triton_cpu.sh`), so the CPU
suite itself never imports triton. bf16 references compute as the torch layers of runtime/layers do,
op by op in bf16: where the kernels promise torch's roundings (rotary, the residual add) the
results must be equal, elsewhere within one bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixgen.kernels.grammar_mask import apply_token_bitmask_reference

pytestmark = [pytest.mark.gpu, pytest.mark.triton_interpret]

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
SIZES = [0, 1, 7, 33, 1000, 70_000] if ON_GPU else [0, 1, 33]
BF16, F32 = torch.bfloat16, torch.float32
# (heads, kv heads, head dim): the default model's GQA 9/3 at 64, and 128 with 4/1
HEAD_SHAPES = [(9, 3, 64), (4, 1, 128)]


def rand(*shape: int, dtype: torch.dtype = F32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """Drawn on the device (the GPU sizes would take seconds of host time)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=DEVICE) * scale).to(dtype)


def assert_close_bf16(got: torch.Tensor, want: torch.Tensor, exact_share: float = 0.99) -> None:
    """Within one bf16 rounding, and bit-equal almost everywhere (the kernels differ from torch
    only in float32 summation order and exp/sqrt last bits)."""
    assert got.dtype == want.dtype == BF16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-5)
    if got.numel():
        assert (got == want).float().mean().item() >= exact_share


# --- add + RMSNorm ------------------------------------------------------------------------------


def reference_add_rmsnorm(
    x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    r = residual if x is None else residual + x.float()
    normed = F.rms_norm(r, (r.shape[-1],), eps=eps).to(weight.dtype) * weight
    return normed, r


def bf16_neighbours(h: torch.Tensor) -> list[torch.Tensor]:
    """h and the bf16 values one unit in the last place below and above it (finite, nonzero h)."""
    bits = h.view(torch.int16)
    return [(bits - 1).view(BF16), h, (bits + 1).view(BF16)]


def assert_normed_times_weight(
    got: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """Each output is torch's bf16 product of the weight and the bf16 norm, or of the bf16 value
    one place beside that norm: the kernel rounds norm(residual) to bf16 before the weight
    multiplies it, as torch does, and its rsqrt and float32 sum may flip that first rounding.
    (A flip can move the product by two of its own places, where the norm sits at the bottom of
    a binade and the weight is below 1: no plain tolerance on the product says this.)"""
    normed = F.rms_norm(residual, (residual.shape[-1],), eps=eps).to(BF16)
    match = torch.zeros_like(got, dtype=torch.bool)
    for candidate in bf16_neighbours(normed):
        match |= got == candidate * weight
    assert bool(match.all()), f"{int((~match).sum())} outputs are no neighbour's product"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype", "hidden"),
    [(BF16, BF16, 576), (F32, BF16, 576), (F32, F32, 100), (None, BF16, 64)],
)
def test_add_rmsnorm(
    n: int, x_dtype: torch.dtype | None, w_dtype: torch.dtype, hidden: int
) -> None:
    from radixgen.kernels.triton.norm import add_rmsnorm

    residual = rand(n, hidden, seed=1, scale=3.0)
    x = None if x_dtype is None else rand(n, hidden, dtype=x_dtype, seed=2)
    weight = (1.0 + 0.2 * rand(hidden, seed=3)).to(w_dtype)
    want, want_residual = reference_add_rmsnorm(x, residual, weight, 1e-5)
    out = add_rmsnorm(x, residual, weight, 1e-5)
    assert torch.equal(residual, want_residual)  # updated in place, the same float32 adds
    if w_dtype == BF16:
        assert_normed_times_weight(out, want_residual, weight, 1e-5)
        if out.numel():
            assert (out == want).float().mean().item() >= 0.99
    else:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


# --- SiLU-mul -----------------------------------------------------------------------------------


def reference_silu_mul(gate_up: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if gate_up.dtype == out_dtype == BF16:
        return F.silu(gate) * up  # torch's bf16 roundings: silu, then the product
    return (F.silu(gate.float()) * up.float()).to(out_dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    ("in_dtype", "out_dtype", "inter"),
    [(BF16, BF16, 1536), (F32, BF16, 1536), (F32, F32, 200), (BF16, F32, 40)],
)
def test_silu_mul(n: int, in_dtype: torch.dtype, out_dtype: torch.dtype, inter: int) -> None:
    from radixgen.kernels.triton.activation import silu_mul

    gate_up = rand(n, 2 * inter, dtype=in_dtype, seed=4, scale=4.0)
    out = silu_mul(gate_up, out_dtype)
    want = reference_silu_mul(gate_up, out_dtype)
    if out_dtype == BF16:
        assert_close_bf16(out, want)
    else:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


# --- rotary + KV store --------------------------------------------------------------------------


def rope_tables(head_dim: int, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin as runtime/layers' RotaryEmbedding lays them out (each half repeated)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_positions).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(DEVICE), emb.sin().to(DEVICE)


def reference_rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """x [N, heads, D] rotated at per-token cos/sin rows [N, D] (rotary.py's `_rotate`)."""
    if x.dtype != out_dtype or x.dtype != BF16:
        x, cos, sin = x.float(), cos.float(), sin.float()
    else:
        cos, sin = cos.to(BF16), sin.to(BF16)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(out_dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("heads", HEAD_SHAPES)
@pytest.mark.parametrize(("in_dtype", "pool_dtype"), [(BF16, BF16), (F32, BF16), (F32, F32)])
def test_rope_store_kv(
    n: int, heads: tuple[int, int, int], in_dtype: torch.dtype, pool_dtype: torch.dtype
) -> None:
    from radixgen.kernels.triton.rotary_kv import rope_store_kv

    h, hkv, d = heads
    q_size, kv_size = h * d, hkv * d
    cos, sin = rope_tables(d, 4096)
    gen = torch.Generator().manual_seed(n)
    positions = torch.randint(0, 4096, (n,), generator=gen).to(DEVICE)
    slots = n + 11
    loc = (torch.randperm(slots, generator=gen)[:n]).to(DEVICE)  # shuffled, some slots unused
    # a strided qkv: the projection's rows inside a wider buffer
    qkv = rand(n, q_size + 2 * kv_size + 8, dtype=in_dtype, seed=5)[:, : q_size + 2 * kv_size]
    k_pool = rand(slots, hkv, d, dtype=pool_dtype, seed=6)
    v_pool = rand(slots, hkv, d, dtype=pool_dtype, seed=7)
    k_before, v_before = k_pool.clone(), v_pool.clone()

    q = rope_store_kv(qkv, positions, cos, sin, k_pool, v_pool, loc, h, hkv, d)

    c, s = cos[positions], sin[positions]
    q_in, k_in, v_in = qkv.split([q_size, kv_size, kv_size], dim=-1)
    want_q = reference_rotate(q_in.reshape(n, h, d), c, s, pool_dtype)
    want_k = reference_rotate(k_in.reshape(n, hkv, d), c, s, pool_dtype)
    want_v = v_in.reshape(n, hkv, d).to(pool_dtype)
    assert q.shape == (n, h, d) and q.dtype == pool_dtype
    if in_dtype == pool_dtype == BF16:  # the same bf16 roundings as torch, op by op
        assert torch.equal(q, want_q) and torch.equal(k_pool[loc], want_k)
    else:
        tol = 1e-5 if pool_dtype == F32 else 2**-7
        torch.testing.assert_close(q, want_q, rtol=tol, atol=tol)
        torch.testing.assert_close(k_pool[loc], want_k, rtol=tol, atol=tol)
    assert torch.equal(v_pool[loc], want_v)
    untouched = torch.ones(slots, dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert torch.equal(k_pool[untouched], k_before[untouched])
    assert torch.equal(v_pool[untouched], v_before[untouched])


# --- grammar bitmask ----------------------------------------------------------------------------


def random_bitmask(rows: int, words: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64)
    return bits.to(torch.int32)


@pytest.mark.parametrize(
    ("batch", "vocab", "words", "rows"),
    [
        (3, 1000, 32, None),  # a partial last word
        (5, 2053, 40, [4, 0, 2]),  # a mask narrower than the vocab, a subset of rows
        (2, 64, 2, []),
        (0, 100, 4, None),
    ],
)
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_apply_token_bitmask(
    batch: int, vocab: int, words: int, rows: list[int] | None, dtype: torch.dtype
) -> None:
    from radixgen.kernels.triton.bitmask import apply_token_bitmask

    # logits inside a wider buffer (the sampler slices the padded vocab away)
    logits = rand(batch, vocab + 5, dtype=dtype, seed=8, scale=10.0)[:, :vocab]
    mask = random_bitmask(batch if rows is None else len(rows), words, seed=9)
    row_t = None if rows is None else torch.tensor(rows, dtype=torch.long)
    want = logits.cpu().clone()
    apply_token_bitmask_reference(want, mask, row_t)
    apply_token_bitmask(logits, mask.to(DEVICE), row_t)
    assert torch.equal(logits.cpu(), want)


def test_grammar_mask_dispatches_to_the_kernel_on_cuda() -> None:
    """`apply_token_bitmask` of grammar_mask.py gives the reference on the logits' device (the
    Triton kernel on CUDA, the table lookup on CPU)."""
    from radixgen.kernels.grammar_mask import apply_token_bitmask

    logits = rand(6, 3001, seed=10, scale=5.0)
    mask = random_bitmask(3, 94, seed=11)
    rows = torch.tensor([5, 1, 3])
    want = logits.cpu().clone()
    apply_token_bitmask_reference(want, mask, rows)
    apply_token_bitmask(logits, mask.to(DEVICE), rows)
    assert torch.equal(logits.cpu(), want)


# --- the ops object and its selection -----------------------------------------------------------


def test_selection_and_the_ops_object() -> None:
    from radixgen.kernels.layer_ops import select_gpu_fused_ops
    from radixgen.kernels.triton.fused_ops import TritonFusedOps

    assert select_gpu_fused_ops("cpu", F32) is None
    assert select_gpu_fused_ops("cuda", torch.float16) is None
    if ON_GPU:
        assert isinstance(select_gpu_fused_ops("cuda", BF16), TritonFusedOps)
    ops = TritonFusedOps()
    residual = rand(3, 64, seed=12)
    weight = rand(64, seed=13).to(BF16)
    x = rand(3, 64, dtype=BF16, seed=14)
    _, want_residual = reference_add_rmsnorm(x, residual, weight, 1e-6)
    assert_normed_times_weight(
        ops.add_rmsnorm(x, residual, weight, 1e-6), want_residual, weight, 1e-6
    )
    assert torch.equal(residual, want_residual)
    gate_up = rand(3, 80, dtype=BF16, seed=15)
    assert_close_bf16(ops.silu_mul(gate_up), reference_silu_mul(gate_up, BF16))


# --- GPU only: offsets past 2^31 elements -------------------------------------------------------


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device (tens of GB)")
def test_offsets_past_2_31_elements() -> None:
    """Row offsets of the last rows (and pool slots) are over int32: the kernels index in int64."""
    from radixgen.kernels.triton.bitmask import apply_token_bitmask
    from radixgen.kernels.triton.norm import add_rmsnorm
    from radixgen.kernels.triton.rotary_kv import rope_store_kv

    hidden = 576
    n = (1 << 31) // hidden + 64
    residual = torch.randn(n, hidden, device=DEVICE)
    weight = torch.ones(hidden, dtype=BF16, device=DEVICE)
    tail = residual[-8:].clone()
    out = add_rmsnorm(None, residual, weight, 1e-5)
    want, _ = reference_add_rmsnorm(None, tail, weight, 1e-5)
    assert_close_bf16(out[-8:], want)
    del residual, out

    h, hkv, d = 9, 3, 64
    slots = (1 << 31) // (hkv * d) + 64
    k_pool = torch.zeros(slots, hkv, d, dtype=BF16, device=DEVICE)
    v_pool = torch.zeros_like(k_pool)
    loc = torch.tensor([slots - 1, 5], device=DEVICE)
    positions = torch.tensor([0, 0], device=DEVICE)  # cos 1, sin 0: k is stored unchanged
    cos, sin = rope_tables(d, 4)
    qkv = torch.randn(2, (h + 2 * hkv) * d, device=DEVICE).to(BF16)
    rope_store_kv(qkv, positions, cos, sin, k_pool, v_pool, loc, h, hkv, d)
    k_in, v_in = qkv[:, h * d :].view(2, 2, hkv, d).unbind(1)
    assert torch.equal(k_pool[loc], k_in) and torch.equal(v_pool[loc], v_in)
    del k_pool, v_pool

    vocab = 1 << 17
    batch = (1 << 31) // vocab + 2
    logits = torch.zeros(batch, vocab, dtype=BF16, device=DEVICE)
    mask = torch.zeros(1, vocab // 32, dtype=torch.int32, device=DEVICE)
    mask[0, 0] = 1  # only token 0 allowed
    apply_token_bitmask(logits, mask, torch.tensor([batch - 1]))
    last = logits[-1]
    assert last[0] == 0 and bool(torch.isinf(last[1:]).all()) and bool((logits[0] == 0).all())
