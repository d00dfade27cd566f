"""The fast bitmask kernel against the bit-by-bit reference, and the sampler entry point."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.kernels.grammar_mask import apply_token_bitmask, apply_token_bitmask_reference
from radixgen.kernels.sampling import apply_token_bitmask as sampler_entry


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 6),
    vocab=st.integers(1, 200),
    seed=st.integers(0, 2**31 - 1),
    use_rows=st.booleans(),
    extra_words=st.integers(0, 1),
)
def test_fast_kernel_matches_reference(batch, vocab, seed, use_rows, extra_words):
    gen = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32 + extra_words
    logits = torch.randn(batch, vocab, generator=gen)
    if use_rows:
        chosen = torch.randperm(batch, generator=gen)[
            : torch.randint(0, batch + 1, (1,), generator=gen)
        ]
        rows = chosen.sort().values
    else:
        rows = None
    n_mask = batch if rows is None else rows.numel()
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n_mask, words), dtype=torch.int32, generator=gen)
    fast, ref = logits.clone(), logits.clone()
    apply_token_bitmask(fast, bitmask, rows)
    apply_token_bitmask_reference(ref, bitmask, rows)
    assert torch.equal(fast, ref)


def test_mask_narrower_than_vocab_bans_the_rest():
    logits = torch.zeros(1, 40)
    bitmask = torch.full((1, 1), -1, dtype=torch.int32)  # 32 tokens allowed
    apply_token_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0, :32]).all() and torch.isinf(logits[0, 32:]).all()


def test_sampler_entry_point_and_untouched_rows():
    logits = torch.randn(4, 64)
    before = logits.clone()
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 0] = 1 << 5  # only token 5 allowed
    sampler_entry(logits, bitmask, torch.tensor([2]))
    assert torch.equal(logits[[0, 1, 3]], before[[0, 1, 3]])
    assert logits[2].argmax().item() == 5 and torch.isinf(logits[2]).sum() == 63
    sampler_entry(logits, bitmask[:0], torch.tensor([], dtype=torch.long))  # nothing to apply
