"""The native ragged kernel reads a key block once for all the query rows of a request that see
it (speculative verify rows, prefill chunks): each row's output stays bitwise the one it gets
alone, as a decode row at its position, for every KV pool format."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels.cpu import load_native_kernels

native = load_native_kernels()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler for the native kernels")

HKV = 2
# (q / model dtype, pool dtype, with per-row scales)
FORMATS = [
    (torch.bfloat16, torch.bfloat16, False),
    (torch.float32, torch.float32, False),
    (torch.bfloat16, torch.int8, True),
    (torch.bfloat16, torch.float8_e4m3fn, False),
    (torch.float32, torch.float8_e4m3fn, True),
    (torch.float32, torch.bfloat16, False),
]
# (first position, rows): 9 verify rows at a 1.5k context (the last block partial and different
# for each row), 64-row prefill chunks across a block boundary and within later blocks, a few
# short rows, and a decode row between them
REQS = [(1490, 9), (200, 64), (1000, 64), (3, 5), (700, 1)]


def _pool(pool_dtype: torch.dtype, scaled: bool, size: int, d: int):
    if pool_dtype == torch.int8:
        k, v = (torch.randint(-127, 128, (size, HKV, d), dtype=torch.int8) for _ in range(2))
    else:
        k, v = (torch.randn(size, HKV, d).to(pool_dtype) for _ in range(2))
    scales = (torch.rand(size, HKV) * 0.05 + 0.01, torch.rand(size, HKV) * 0.05 + 0.01)
    return k, v, scales if scaled else None


@pytest.mark.parametrize(("dtype", "pool_dtype", "scaled"), FORMATS)
@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("G", [1, 3, 4])
@pytest.mark.parametrize("D", [64, 128])
def test_every_row_is_bitwise_its_decode_alone(native, dtype, pool_dtype, scaled, window, G, D):
    torch.manual_seed(G * 1000 + D)
    size = 4000
    k, v, scales = _pool(pool_dtype, scaled, size, D)
    perm = torch.randperm(size - 1) + 1  # scattered slots
    kv, off = [], 0
    for p, n in REQS:
        kv.append(perm[off : off + p + n])
        off += p + n
    kv_indptr = torch.tensor([0, *torch.tensor([p + n for p, n in REQS]).cumsum(0).tolist()])
    q_indptr = torch.tensor([0, *torch.tensor([n for _, n in REQS]).cumsum(0).tolist()])
    q_pos0 = torch.tensor([p for p, _ in REQS])
    rows = int(q_indptr[-1])
    H = G * HKV
    q = torch.randn(rows, (H + 2 * HKV) * D).to(dtype)[:, : H * D].view(rows, H, D)  # strided
    batched = torch.empty(rows, H, D, dtype=dtype)
    scale = D**-0.5
    native.ragged_attention(
        q, k, v, torch.cat(kv), kv_indptr, q_indptr, q_pos0, batched, scale, window, scales
    )
    alone = torch.empty(1, H, D, dtype=dtype)
    for r, (p0, n) in enumerate(REQS):
        for j in range(n):
            row, pos = int(q_indptr[r]) + j, p0 + j
            native.ragged_attention(
                q[row : row + 1], k, v, kv[r][: pos + 1].contiguous(), torch.tensor([0, pos + 1]),
                torch.tensor([0, 1]), torch.tensor([pos]), alone, scale, window, scales,
            )  # fmt: skip
            assert torch.equal(alone[0].view(torch.uint8), batched[row].view(torch.uint8)), (
                f"request {r} row {j} (position {pos}) differs from the row alone"
            )
    assert torch.isfinite(batched.float()).all()
