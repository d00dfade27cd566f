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
    _assert_each_row_is_its_decode_alone(
        native, q, k, v, kv, q_indptr, q_pos0.tolist(), batched, scale, window, scales
    )


def _assert_each_row_is_its_decode_alone(
    native, q, k, v, kv, q_indptr, pos0, batched, scale, window, scales
):
    """Every row of the batched result equals, bit for bit, the same row run alone as a decode
    row at its position over its request's keys `kv[r]`."""
    alone = torch.empty(1, *q.shape[1:], dtype=q.dtype)
    for r in range(len(kv)):
        for j in range(int(q_indptr[r + 1] - q_indptr[r])):
            row, pos = int(q_indptr[r]) + j, pos0[r] + j
            native.ragged_attention(
                q[row : row + 1], k, v, kv[r][: pos + 1].contiguous(), torch.tensor([0, pos + 1]),
                torch.tensor([0, 1]), torch.tensor([pos]), alone, scale, window, scales,
            )  # fmt: skip
            assert torch.equal(alone[0].view(torch.uint8), batched[row].view(torch.uint8)), (
                f"request {r} row {j} (position {pos}) differs from the row alone"
            )
    assert torch.isfinite(batched.float()).all()


# Requests on one cached prefix (the same pool slots for its first 700 positions: two whole key
# blocks and part of a third): decode rows and a prefill chunk that share its whole blocks, one
# that diverges inside the second block (shares only the first), one too short to see a whole
# block, and a last one on the prefix again after them (not adjacent to the others).
SHARED = 700
SHARERS = [  # (slots of the shared prefix it keeps, own positions after them, rows)
    (SHARED, 40, 1),
    (SHARED, 90, 1),
    (SHARED, 5, 30),
    (SHARED, 300, 1),
    (-1, 60, 1),  # the prefix with one slot of its second block replaced
    (200, 0, 1),
    (SHARED, 12, 1),
]


@pytest.mark.parametrize(("dtype", "pool_dtype", "scaled"), FORMATS)
@pytest.mark.parametrize("G", [1, 3])
def test_rows_on_a_shared_prefix_are_bitwise_their_decode_alone(
    native, dtype, pool_dtype, scaled, G
):
    """Requests whose whole key blocks hold the same slots read them once for all their rows
    (cascade attention); every row still gets its own decode's output, bit for bit."""
    torch.manual_seed(G)
    D, size = 64, 6000
    k, v, scales = _pool(pool_dtype, scaled, size, D)
    perm = torch.randperm(size - 1) + 1
    prefix, off = perm[:SHARED], SHARED
    kv, rows_of, pos0 = [], [], []
    for keep, own, rows in SHARERS:
        slots = prefix.clone()
        if keep < 0:
            slots[300] = perm[off]
            off += 1
            keep = SHARED
        tail = perm[off : off + own + rows - 1]
        off += own + rows - 1
        kv.append(torch.cat([slots[:keep], tail]))
        rows_of.append(rows)
        pos0.append(keep + own - 1)
    kv_indptr = torch.tensor([0, *torch.tensor([len(s) for s in kv]).cumsum(0).tolist()])
    q_indptr = torch.tensor([0, *torch.tensor(rows_of).cumsum(0).tolist()])
    n = int(q_indptr[-1])
    H = G * HKV
    q = torch.randn(n, H, D).to(dtype)
    batched = torch.empty(n, H, D, dtype=dtype)
    scale = D**-0.5
    native.ragged_attention(
        q, k, v, torch.cat(kv), kv_indptr, q_indptr, torch.tensor(pos0), batched, scale, None,
        scales,
    )  # fmt: skip
    _assert_each_row_is_its_decode_alone(
        native, q, k, v, kv, q_indptr, pos0, batched, scale, None, scales
    )
