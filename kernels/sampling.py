"""Batched sampling kernels in torch: penalties, top-k / top-p / min-p filtering, inverse-CDF draws.

Every op works on the whole [B, V] batch at once; per-row parameters are [B] tensors. Randomness
enters only as one uniform number per row, which the caller derives from the request's own seed
and step, so a seeded request samples the same token whatever else shares its batch.
"""

from __future__ import annotations

import torch

# Re-exported: the sampler applies grammar masks through this module.
from .grammar_mask import apply_token_bitmask as apply_token_bitmask

# top-k below this reads only the k largest probabilities instead of sorting the vocabulary
_PARTIAL_SORT_K = 1024


def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    seen_mask: torch.Tensor | None,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
) -> None:
    """In place. counts: [B, V] generated-token counts; seen_mask: prompt+output tokens (repetition)."""
    logits -= frequency[:, None] * output_counts
    logits -= presence[:, None] * (output_counts > 0).to(logits.dtype)
    if seen_mask is not None:
        rep = repetition[:, None].expand_as(logits)
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        torch.where(seen_mask, penalised, logits, out=logits)


def sample_from_probs(
    probs: torch.Tensor,
    uniforms: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """probs: [B, V] (rows sum to 1); returns [B] token ids.

    Filters apply in SGLang's order (top-k, then top-p, then min-p) over probabilities sorted in
    descending order (ties by token id), then one inverse-CDF draw per row. NOTE: every choice is
    made per row from that row alone (whether its candidates fit in the top `_PARTIAL_SORT_K`, the
    tie order), so a row samples the same token whatever other rows share the batch.
    """
    vocab = probs.shape[-1]
    if top_k is None and top_p is None and min_p is None:
        return _inverse_cdf(probs, uniforms)
    if probs.device.type != "cpu":
        # NOTE: splitting rows by whether they fit the head would read a mask on the host (a
        # wait for the device); a GPU sorts the whole vocabulary of every row quickly instead
        sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True, stable=True)
        return _filtered_draw(sorted_probs, sorted_idx, uniforms, top_k, top_p, min_p)
    partial = min(_PARTIAL_SORT_K, vocab)
    head_vals, head_idx = probs.topk(partial, dim=-1)
    fits = (
        (top_k <= partial) if top_k is not None else torch.zeros(probs.shape[0], dtype=torch.bool)
    )
    if top_p is not None:
        fits |= head_vals.sum(dim=-1) >= top_p  # the nucleus lies inside the head
    out = torch.empty(probs.shape[0], dtype=torch.long)
    for rows, use_head in ((fits.nonzero().flatten(), True), ((~fits).nonzero().flatten(), False)):
        if rows.numel() == 0:
            continue
        if use_head:
            sorted_probs, sorted_idx = _stable_descending(head_vals[rows], head_idx[rows])
        else:
            sorted_probs, order = probs[rows].sort(dim=-1, descending=True, stable=True)
            sorted_idx = order
        out[rows] = _filtered_draw(
            sorted_probs,
            sorted_idx,
            uniforms[rows],
            None if top_k is None else top_k[rows],
            None if top_p is None else top_p[rows],
            None if min_p is None else min_p[rows],
        )
    return out


def _filtered_draw(
    sorted_probs: torch.Tensor,
    sorted_idx: torch.Tensor,
    uniforms: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """Token ids drawn from rows sorted in descending order after top-k, top-p, min-p."""
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device)
    if top_k is not None:
        keep &= ranks[None, :] < top_k[:, None]
    if top_p is not None:
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each entry
        keep &= before < top_p[:, None]
    if min_p is not None:
        keep &= sorted_probs >= (min_p * sorted_probs[:, 0])[:, None]
    keep[:, 0] = True  # the most likely token always survives
    choice = _inverse_cdf(sorted_probs * keep, uniforms)
    return sorted_idx.gather(1, choice[:, None]).squeeze(1)


def _stable_descending(vals: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order top-k candidates by probability, ties by token id (topk leaves tie order open)."""
    idx_sorted, perm = idx.sort(dim=-1)
    vals = vals.gather(1, perm)
    vals_sorted, order = vals.sort(dim=-1, descending=True, stable=True)
    return vals_sorted, idx_sorted.gather(1, order)


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index drawn in proportion to non-negative `weights` [B, V] using uniforms [B] in [0, 1)."""
    cdf = weights.cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    idx = idx.clamp(max=weights.shape[-1] - 1)
    # a zero-weight entry can only be hit through rounding at the very top: step back to a real one
    bad = weights.gather(1, idx[:, None]).squeeze(1) <= 0
    # NOTE: on a GPU the fix-up always runs: testing `bad` on the host would wait for the device
    if weights.device.type != "cpu" or bool(bad.any()):
        last_nonzero = (weights > 0).cumsum(dim=-1).argmax(dim=-1)
        idx = torch.where(bad, last_nonzero, idx)
    return idx
