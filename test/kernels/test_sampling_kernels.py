"""The batched sampling kernels: each filter keeps exactly the tokens SGLang's rules keep, draws
follow the filtered distribution, and penalties move the logits the documented way."""

from __future__ import annotations

import torch

from radixgen.kernels.sampling import apply_penalties, sample_from_probs

PROBS = torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04]])


def _support(top_k=None, top_p=None, min_p=None, draws: int = 400) -> set[int]:
    """Every token drawn over a grid of uniforms (the support of the filtered distribution)."""
    u = (torch.arange(draws, dtype=torch.float32) + 0.5) / draws
    probs = PROBS.expand(draws, -1).contiguous()

    def col(v):
        return (
            None
            if v is None
            else torch.full(
                (draws,), v, dtype=torch.float32 if isinstance(v, float) else torch.long
            )
        )

    return set(sample_from_probs(probs, u, col(top_k), col(top_p), col(min_p)).tolist())


def test_unfiltered_draws_cover_the_whole_distribution():
    assert _support() == set(range(6))


def test_top_k_keeps_the_k_most_likely():
    assert _support(top_k=1) == {0}
    assert _support(top_k=3) == {0, 1, 2}


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    # mass above each token: 0, .40, .65, .80, .90, .96 -> kept while strictly below p
    assert _support(top_p=0.5) == {0, 1}
    assert _support(top_p=0.8) == {0, 1, 2}
    assert _support(top_p=1.0) == set(range(6))


def test_min_p_keeps_tokens_within_a_share_of_the_best():
    assert _support(min_p=0.5) == {0, 1}  # >= 0.20
    assert _support(min_p=0.2) == {0, 1, 2, 3}  # >= 0.08


def test_filters_compose_in_sglangs_order():
    assert _support(top_k=4, top_p=0.7, min_p=0.3) == {0, 1, 2}


def test_draw_frequencies_follow_the_filtered_distribution():
    n = 20000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0))
    draws = sample_from_probs(PROBS.expand(n, -1).contiguous(), u, torch.full((n,), 2), None, None)
    share = (draws == 0).float().mean().item()
    assert abs(share - 0.40 / 0.65) < 0.02  # renormalised over the two kept tokens


def test_penalties():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    counts = torch.tensor([[2.0, 0.0, 1.0, 0.0]])
    seen = torch.tensor([[False, True, False, True]])
    out = logits.clone()
    apply_penalties(
        out, counts, seen, torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([2.0])
    )
    # frequency 0.5 * count, presence 1.0 if generated, repetition divides positive / multiplies
    # negative logits of seen tokens
    assert torch.allclose(out, torch.tensor([[2.0 - 1.0 - 1.0, -2.0, 0.5 - 0.5 - 1.0, 1.5]]))


# --- the device (GPU) paths, run here on CPU tensors ------------------------------------------


def test_full_sort_draw_equals_the_head_split():
    """On a GPU, `sample_from_probs` sorts every row whole instead of splitting rows by whether
    their candidates fit the top-1024 head (that split reads a mask on the host): both give each
    row the same token."""
    from radixgen.kernels.sampling import _filtered_draw

    gen = torch.Generator().manual_seed(3)
    b, v = 12, 3000
    probs = torch.softmax(torch.randn(b, v, generator=gen) * 3, dim=-1)
    uniforms = torch.rand(b, generator=gen)
    top_k = torch.tensor([1, 5, 40, 2000, 3000, 7, 1, 1500, 20, 3000, 100, 2], dtype=torch.long)
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.999, 1.0, 0.3, 0.8, 0.95, 1.0, 0.99, 0.7, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.001, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0])
    expected = sample_from_probs(probs, uniforms, top_k, top_p, min_p)
    sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True, stable=True)
    got = _filtered_draw(sorted_probs, sorted_idx, uniforms, top_k, top_p, min_p)
    assert got.tolist() == expected.tolist()


def test_topk_refinement_equals_the_nonzero_refinement():
    """The GPU refinement of near-max bf16 logits (top-16 candidates, no host read) re-scores
    exactly the candidates the CPU one does."""
    from radixgen.runtime.model_executor.logits_output import (
        refine_near_max,
        refine_near_max_topk,
    )

    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(6, 32, generator=gen).to(torch.bfloat16)
    weight = torch.randn(500, 32, generator=gen).to(torch.bfloat16)
    weight[7] = weight[9]  # exact ties at the top of some rows
    hidden[2] = weight[7]
    raw = (hidden @ weight.T).float()
    a, b = raw.clone(), raw.clone()
    refine_near_max(a, hidden, weight)
    refine_near_max_topk(b, hidden, weight)
    assert torch.equal(a, b)
    assert not torch.equal(a, raw)  # something was re-scored
