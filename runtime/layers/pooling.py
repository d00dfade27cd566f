"""Token states to one vector per sequence: cls, mean or last-token pooling, L2 normalisation
and Matryoshka truncation (scheduler process).

Pooling runs in float32 whatever the model dtype: a mean over hundreds of bf16 rows would round
at every add.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, L, H] states of right-padded sequences (mask [B, L], 1 on real tokens) -> [B, H]."""
    h = hidden.float()
    if mode == "cls":
        return h[:, 0]
    lengths = mask.sum(dim=1)
    if mode == "last":
        return h[torch.arange(h.shape[0], device=h.device), lengths - 1]
    if mode == "mean":
        m = mask.to(h.dtype).unsqueeze(-1)
        return (h * m).sum(dim=1) / lengths.clamp(min=1).to(h.dtype).unsqueeze(-1)
    raise ValueError(f"unknown pooling mode {mode!r}")


def finish_vector(vec: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """One pooled vector as served: L2-normalised when the model normalises; with Matryoshka
    `dimensions`, the first `dimensions` values, normalised again (OpenAI's `dimensions` gives
    unit vectors, which the truncated prefix of a unit vector is not)."""
    if normalize:
        vec = F.normalize(vec, dim=-1)
    if dimensions is not None and dimensions < vec.shape[-1]:
        vec = vec[..., :dimensions]
        if normalize:
            vec = F.normalize(vec, dim=-1)
    return vec
