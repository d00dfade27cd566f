"""The native ragged attention kernel: exact against a float64 reference, and batch-invariant."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.cpu import load_native_kernels

native = load_native_kernels()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler for the native kernels")

# (heads, kv heads, head dim): the generic kernel and the shapes compiled with constant group
# size and head dim (SmolLM2's 9/3/64, Qwen-like 12/4/128), grouped and ungrouped
SHAPES = [(6, 2, 32), (9, 3, 64), (12, 4, 128), (8, 8, 64), (16, 2, 64)]
# (prefix, extend): decode rows, short and long prefill chunks, keys past the 256-key block
REQS = [(0, 37), (300, 1), (5, 600), (0, 1), (40, 3), (700, 2)]


def _reference(q, k_pool, v_pool, kv, reqs, window=None):
    _, H, D = q.shape
    HKV = k_pool.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    row = 0
    for r, (prefix, ext) in enumerate(reqs):
        keys = k_pool[kv[r]].double().repeat_interleave(H // HKV, dim=1)
        vals = v_pool[kv[r]].double().repeat_interleave(H // HKV, dim=1)
        for j in range(ext):
            p = prefix + j
            lo = 0 if window is None else max(0, p + 1 - window)
            s = torch.einsum("hd,lhd->hl", q[row].double(), keys[lo : p + 1]) * D**-0.5
            out[row] = torch.einsum("hl,lhd->hd", s.softmax(-1), vals[lo : p + 1])
            row += 1
    return out


def _layout(reqs, pool_size):
    perm = torch.randperm(pool_size - 1) + 1  # scattered slots, like a fragmented pool
    kv, off = [], 0
    for p, e in reqs:
        kv.append(perm[off : off + p + e])
        off += p + e
    kv_indptr = torch.tensor([0, *torch.tensor([p + e for p, e in reqs]).cumsum(0).tolist()])
    q_indptr = torch.tensor([0, *torch.tensor([e for _, e in reqs]).cumsum(0).tolist()])
    q_pos0 = torch.tensor([p for p, _ in reqs])
    return kv, torch.cat(kv), kv_indptr, q_indptr, q_pos0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize(("H", "HKV", "D"), SHAPES)
def test_matches_reference(native, dtype, window, H, HKV, D):
    torch.manual_seed(0)
    k_pool = torch.randn(6000, HKV, D).to(dtype)
    v_pool = torch.randn(6000, HKV, D).to(dtype)
    kv, flat, kv_indptr, q_indptr, q_pos0 = _layout(REQS, 6000)
    n = int(q_indptr[-1])
    qkv = torch.randn(n, (H + 2 * HKV) * D).to(dtype)  # strided q rows, as in the model
    q = qkv[:, : H * D].view(n, H, D)
    out = torch.empty(n, H, D, dtype=dtype)
    native.ragged_attention(
        q, k_pool, v_pool, flat, kv_indptr, q_indptr, q_pos0, out, D**-0.5, window
    )
    ref = _reference(q, k_pool, v_pool, kv, REQS, window)
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(("H", "HKV", "D"), SHAPES)
def test_a_row_is_the_same_alone_or_batched(native, H, HKV, D):
    """Prefill row, decode row: bitwise equal whatever batch or chunking computed them."""
    torch.manual_seed(1)
    k_pool = torch.randn(6000, HKV, D).bfloat16()
    v_pool = torch.randn(6000, HKV, D).bfloat16()
    kv, flat, kv_indptr, q_indptr, q_pos0 = _layout(REQS, 6000)
    n = int(q_indptr[-1])
    q = torch.randn(n, H, D).bfloat16()
    batched = torch.empty_like(q)
    native.ragged_attention(q, k_pool, v_pool, flat, kv_indptr, q_indptr, q_pos0, batched, D**-0.5)
    for r, j in [(2, 10), (2, 599), (0, 36), (5, 1)]:
        pos = REQS[r][0] + j
        row = int(q_indptr[r]) + j
        alone = torch.empty(1, H, D, dtype=torch.bfloat16)
        native.ragged_attention(
            q[row : row + 1], k_pool, v_pool, kv[r][: pos + 1].contiguous(),
            torch.tensor([0, pos + 1]), torch.tensor([0, 1]), torch.tensor([pos]), alone, D**-0.5,
        )  # fmt: skip
        assert torch.equal(alone[0], batched[row])
