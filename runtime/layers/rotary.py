"""Rotary position tables: the plain half-split (NeoX-style) table with default, linear or
llama3 frequency scaling, and Phi-3's longrope short/long pair (scheduler process).

Both keep float32 cos/sin buffers indexed by table row; the fused rotary + KV store kernels read
the same buffers, so the tables are the one source of the rotation on every path.

Longrope keeps two tables, short factors and long factors (both scaled by the attention factor),
stacked in one buffer: a request whose sequence (cached prefix + this step's tokens) is longer
than original_max_position_embeddings reads the long half, as transformers switches its
frequencies by the current sequence length. A speculative draft's tokens are decode tokens run
ahead: each reads the table by its own position, as the decode step that would otherwise have
computed it does.

NOTE: keys already cached keep the factors they were computed with (as in vLLM and SGLang):
a request crossing the original context mid-generation, a prompt whose first prefill chunk ends
below it, or a cached prefix shared across it, differs from transformers' `generate`, which
then drops its cache and recomputes every key with the long factors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixgen.errors import InvalidRequestError
from radixgen.kernels.device_io import upload

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.models.model_config import ModelArchConfig


def rope_inv_freq(cfg: ModelArchConfig) -> torch.Tensor:
    """The per-pair inverse frequencies, scaled as config.json's rope_scaling asks."""
    inv = _scaled_inv_freq(cfg)
    if cfg.rope_freq_factors:  # llama.cpp divides each frequency by its factor
        inv = inv / torch.tensor(cfg.rope_freq_factors, dtype=inv.dtype)
    return inv


def _scaled_inv_freq(cfg: ModelArchConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise InvalidRequestError(
        f"rope scaling type {kind!r} is not supported (default, linear, llama3)", "model_path"
    )


class RotaryEmbedding(nn.Module):
    """Half-split (NeoX-style) rotary embedding with a precomputed cos/sin table."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        # NOTE: computed on the CPU even inside a meta-device context: meta pow/cos/sin import
        # torch._dynamo (over a second of start-up) and a meta table would be garbage anyway.
        with torch.device("cpu"):
            inv = rope_inv_freq(cfg)
            t = torch.arange(max_positions, dtype=torch.int64).float()
            freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [N, H, D], k: [N, Hkv, D] -> rotated copies (positions: rows of the table)."""
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LongRopeRotaryEmbedding(RotaryEmbedding):
    """Phi-3's rotary: the plain table, or with longrope [short table; long table] of
    max_positions rows each (see the module docstring)."""

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        scaling = cfg.rope_scaling or {}
        self.original: int | None = None
        if scaling.get("rope_type") != "longrope":
            super().__init__(cfg, max_positions)
            return
        nn.Module.__init__(self)
        self.head_dim, self.max_positions = cfg.head_dim, max_positions
        self.original = int(scaling["original_max_position_embeddings"])
        dim = cfg.head_dim
        with torch.device("cpu"):  # see RotaryEmbedding: never on the meta device
            base = cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
            t = torch.arange(max_positions, dtype=torch.int64).float()
            halves = []
            for key in ("short_factor", "long_factor"):
                inv = 1.0 / (torch.tensor(scaling[key], dtype=torch.float32) * base)
                freqs = torch.outer(t, inv)
                halves.append(torch.cat((freqs, freqs), dim=-1))
            emb = torch.cat(halves)
            attn = float(scaling["attention_factor"])
        self.register_buffer("cos", emb.cos() * attn, persistent=False)
        self.register_buffer("sin", emb.sin() * attn, persistent=False)

    def table_rows(self, positions: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Each token's row in the stacked table: its position, offset into the long half when
        its request's sequence is longer than the original context.

        NOTE: a decode token is its request's last, so its sequence length is position + 1:
        decode steps (CUDA graphs included) decide on the device, from positions alone.
        """
        if self.original is None:
            return positions
        if batch.is_decode_only:
            long = positions >= self.original
        else:
            ends = [p + e for p, e in zip(batch.prefix_lens, batch.extend_lens, strict=True)]
            per_req = torch.tensor([end > self.original for end in ends])
            counts = torch.tensor(batch.extend_lens)
            long = upload(torch.repeat_interleave(per_req, counts), positions.device)
            if batch.draft_rows is not None:
                # a draft's tokens decode ahead: each reads the table as its decode step would
                # (so speculation changes no greedy output across the original context)
                drafted = torch.repeat_interleave(torch.tensor(batch.draft_rows), counts)
                drafted = upload(drafted, positions.device)
                long = torch.where(drafted, positions >= self.original, long)
        return positions + long.to(positions.dtype) * self.max_positions
