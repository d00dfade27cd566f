"""Phi-3 decoder: the Llama layout with q/k/v and gate/up already fused in the checkpoint, and
longrope ("su") rotary scaling.

Runs in the scheduler process. Longrope keeps two cos/sin tables, short factors and long
factors (both scaled by the attention factor), stacked in one buffer: a request whose sequence
(cached prefix + this step's tokens) is longer than original_max_position_embeddings reads the
long half, as transformers switches its frequencies by the current sequence length.

A speculative draft's tokens are decode tokens run ahead: each reads the table by its own
position, as the decode step that would otherwise have computed it does.

NOTE: keys already cached keep the factors they were computed with (as in vLLM and SGLang):
a request crossing the original context mid-generation, a prompt whose first prefill chunk ends
below it, or a cached prefix shared across it, differs from transformers' `generate`, which
then drops its cache and recomputes every key with the long factors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from radixgen.kernels.device_io import upload
from radixgen.runtime.models.llama import LlamaForCausalLM, RotaryEmbedding
from radixgen.runtime.models.model_config import ModelArchConfig

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch


class Phi3RotaryEmbedding(RotaryEmbedding):
    """The plain table, or with longrope [short table; long table] of max_positions rows each."""

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


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi3ForCausalLM: checkpoint tensors qkv_proj and gate_up_proj are ours as they are."""

    rotary_cls = Phi3RotaryEmbedding

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        rotary = self.rotary
        assert isinstance(rotary, Phi3RotaryEmbedding)
        return super().forward(input_ids, rotary.table_rows(positions, batch), batch)

    def checkpoint_names(self) -> set[str]:
        return {
            "lm_head.weight" if name == "lm_head" else f"model.{name}"
            for name, _ in self.named_parameters()
        }
