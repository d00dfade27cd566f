"""RadixGen's Triton attention kernels against a float32 reference on ragged paged batches.

`gpu` tests: on a CUDA device with the issue's shapes (prefixes to 2k tokens); on CPU they run
only under Triton's interpreter with small shapes (`bash scripts/test_triton_cpu.sh`, a separate
CI step), so the CPU suite itself never imports triton.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import RaggedBatch, ragged_batch, reference

pytestmark = [pytest.mark.gpu, pytest.mark.triton_interpret]

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
HEAD_DIM = 64
# (prefix, extend) per request: fresh prompts, 1-token prompts, chunks on a cached prefix and
# decode rows (extend 1) in one batch; past 256 keys the decode kernel's splits all hold keys
if ON_GPU:
    MIXED = [(0, 1000), (1, 7), (17, 128), (500, 1), (2047, 1), (0, 1), (500, 128), (1200, 33)]
else:
    MIXED = [(0, 40), (1, 7), (17, 33), (300, 1), (5, 1), (0, 1), (70, 1)]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def batch_for(
    dtype: torch.dtype, page_size: int, seed: int = 0, head_dim: int = HEAD_DIM
) -> RaggedBatch:
    prefixes, extends = (list(x) for x in zip(*MIXED, strict=True))
    return ragged_batch(
        prefixes,
        extends,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
        device=DEVICE,
        seed=seed,
    )


def scaling_of(batch: RaggedBatch) -> float:
    return float(batch.q.shape[-1]) ** -0.5


def run_extend(
    batch: RaggedBatch, window: int | None, softcap: float | None = None
) -> torch.Tensor:
    from radixgen.kernels.triton.extend_attention import extend_attention

    out = torch.full_like(batch.q, float("nan"))
    extend_attention(
        batch.q,
        batch.k_buf,
        batch.v_buf,
        out,
        batch.req_to_token,
        batch.ints(batch.rows),
        batch.ints(batch.prefix_lens),
        batch.ints(batch.extend_lens),
        batch.ints(batch.starts),
        max(batch.extend_lens),
        scaling_of(batch),
        window,
        softcap,
    )
    return out


def run_decode(
    batch: RaggedBatch, picks: list[int], window: int | None, softcap: float | None = None
) -> torch.Tensor:
    """Decode the requests `picks` (each an extend-1 row of `batch`)."""
    from radixgen.kernels.triton.decode_attention import decode_attention

    q = batch.q[[batch.starts[i] for i in picks]]
    out = torch.full_like(q, float("nan"))
    decode_attention(
        q,
        batch.k_buf,
        batch.v_buf,
        out,
        batch.req_to_token,
        batch.ints([batch.rows[i] for i in picks]),
        batch.ints([batch.prefix_lens[i] + 1 for i in picks]),
        scaling_of(batch),
        window,
        None,
        softcap,
    )
    return out


# (dtype, page size, window, softcap, head dim): the last two are Gemma 2's soft-capped logits
# with a window shorter than a key block, at the 16-wide heads of the tiny test models
CASES = [
    (torch.float32, 1, None, None, HEAD_DIM),
    (torch.bfloat16, 16, None, None, HEAD_DIM),
    (torch.float32, 16, 24, None, HEAD_DIM),
    (torch.bfloat16, 1, 24, None, HEAD_DIM),
    (torch.float32, 1, None, 4.0, 16),
    (torch.float32, 1, 8, 4.0, 16),
    (torch.bfloat16, 16, 8, 30.0, HEAD_DIM),
]


@pytest.mark.parametrize(("dtype", "page_size", "window", "softcap", "head_dim"), CASES)
def test_extend_and_decode_match_the_reference(
    dtype: torch.dtype, page_size: int, window: int | None, softcap: float | None, head_dim: int
) -> None:
    batch = batch_for(dtype, page_size, head_dim=head_dim)
    ref = reference(batch, scaling_of(batch), window, softcap)
    tol = TOLERANCE[dtype]
    out = run_extend(batch, window, softcap)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float().cpu(), ref, atol=tol, rtol=tol)

    decodes = [i for i, e in enumerate(batch.extend_lens) if e == 1]
    out = run_decode(batch, decodes, window, softcap)
    assert torch.isfinite(out).all()
    rows = [batch.starts[i] for i in decodes]
    torch.testing.assert_close(out.float().cpu(), ref[rows], atol=tol, rtol=tol)


def test_decode_is_batch_invariant() -> None:
    """A request's decode output is bit-for-bit the same alone and in a batch: its key splits
    depend on its own length only."""
    batch = batch_for(torch.bfloat16, 1, seed=3)
    decodes = [i for i, e in enumerate(batch.extend_lens) if e == 1]
    together = run_decode(batch, decodes, None)
    for j, i in enumerate(decodes):
        alone = run_decode(batch, [i], None)
        assert torch.equal(alone[0], together[j]), i


def test_extend_with_an_empty_batch_launches_nothing() -> None:
    from radixgen.kernels.triton.extend_attention import extend_attention

    batch = ragged_batch([3], [1], device=DEVICE)
    out = torch.zeros(0, 9, HEAD_DIM, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    extend_attention(
        out, batch.k_buf, batch.v_buf, out, batch.req_to_token, empty, empty, empty, empty, 0, 1.0
    )
    assert out.shape == (0, 9, HEAD_DIM)
