"""Tensor-parallel layers and the checkpoint split (every scheduler rank process).

A rank builds the ordinary decoder from its `shard_config` (local heads, MLP columns and vocab
rows), so the column-parallel layers (fused QKV, fused gate/up) are plain `Linear`s of the local
width and need no collective. `parallelize_model` then wraps what does: the row-parallel o_proj
and down_proj (a sum over ranks after the matmul), the vocab-parallel embedding (each rank looks
up its own rows, a sum fills in the rest), and the LM head (each rank's float32 logits columns,
gathered on rank 0 and cut to the real vocabulary there). `shard_checkpoint` narrows each full
Hugging Face tensor to the rank's part as it streams past the loader.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.errors import InvalidRequestError
from radixgen.runtime.distributed.dp_attention import DPAttentionSync, parallelize_dp_attention
from radixgen.runtime.distributed.parallel_state import TensorParallelGroup
from radixgen.runtime.distributed.shard_plan import (
    TensorShard,
    dp_attention_shard,
    shard_config,
    tensor_shard,
)
from radixgen.runtime.model_loader.quant_loader import release_freed_memory
from radixgen.runtime.model_loader.weights import iter_weights
from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.runtime.models.model_config import ModelArchConfig

if TYPE_CHECKING:
    from radixgen.kernels.cpu import NativeKernels
    from radixgen.kernels.layer_ops import FusedLayerOps

# the decoders `parallelize_model` knows the layout of (llama.py's classes)
LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})


class RowParallelLinear(nn.Module):
    """A Linear over this rank's input columns whose partial outputs are summed over ranks.

    NOTE: the sum runs in float32 (bf16 partial sums would round once per rank); the bias lives
    on rank 0 only (zeros elsewhere), so it is added once.
    """

    def __init__(self, inner: nn.Module, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp

    def forward(self, x: torch.Tensor, unrounded: bool = False) -> torch.Tensor:
        y: torch.Tensor = self.inner.forward(x, unrounded=unrounded)
        if y.dtype == torch.float32:
            return self.tp.all_reduce(y)
        return self.tp.all_reduce(y.float()).to(y.dtype)


class VocabParallelEmbedding(nn.Module):
    """This rank's contiguous rows of the padded vocabulary; other ids look up zeros, and the sum
    over ranks gives every token its row (exactly: only one rank contributes a non-zero)."""

    def __init__(self, inner: nn.Embedding, tp: TensorParallelGroup, start: int) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp
        self.start = start
        self.rows = inner.weight.shape[0]

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.inner.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead:
    """Logits over the vocabulary from this rank's LM-head rows: float32 columns per rank,
    gathered on rank 0 and cut to the real vocabulary (the padding never reaches sampling).

    NOTE: float32 from a float32 copy of the rank's rows, whatever the model dtype: rank 0 then
    holds exact logits and needs no near-tie re-scoring against the full head it does not have.
    """

    def __init__(self, weight: torch.Tensor, tp: TensorParallelGroup, vocab_size: int) -> None:
        self.weight = weight if weight.dtype == torch.float32 else weight.float()
        self.tp = tp
        self.vocab_size = vocab_size

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[M, vocab] float32 on rank 0, None on the other ranks (which must still call it)."""
        local = F.linear(hidden.float(), self.weight)
        full = self.tp.gather_columns(local)
        return None if full is None else full[:, : self.vocab_size].contiguous()


def parallelize_model(model: nn.Module, tp: TensorParallelGroup, shard: TensorShard) -> None:
    """Wrap a rank's loaded decoder in place: o_proj and down_proj row-parallel, the embedding
    vocab-parallel. (Call after `load_weights`: the wrappers change parameter names.)"""
    for layer in model.layers:  # type: ignore[union-attr]
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, tp)
        layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj, tp)
    embed = model.embed_tokens
    assert isinstance(embed, nn.Embedding)
    model.embed_tokens = VocabParallelEmbedding(embed, tp, shard.vocab_start)


# HF tensor name suffix -> how it splits: rows/cols of which range
_Q, _KV, _MLP_OUT, _ATTN_IN, _MLP_IN, _VOCAB = "q", "kv", "mlp_out", "attn_in", "mlp_in", "vocab"
_SPLITS = {
    "self_attn.q_proj": _Q,
    "self_attn.k_proj": _KV,
    "self_attn.v_proj": _KV,
    "self_attn.o_proj": _ATTN_IN,
    "mlp.gate_proj": _MLP_OUT,
    "mlp.up_proj": _MLP_OUT,
    "mlp.down_proj": _MLP_IN,
}


def _split_of(name: str) -> str | None:
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return _VOCAB
    for key, kind in _SPLITS.items():
        if f".{key}." in name or name.startswith(f"{key}."):
            return kind
    return None


def shard_tensor(
    name: str, t: torch.Tensor, cfg: ModelArchConfig, shard: TensorShard
) -> torch.Tensor:
    """The part of full checkpoint tensor `name` that rank `shard.rank` keeps."""
    kind = _split_of(name)
    d = cfg.head_dim
    is_bias = name.endswith(".bias")
    if kind == _Q:
        return t.narrow(0, shard.attn_rank * shard.num_heads * d, shard.num_heads * d)
    if kind == _KV:
        return t.narrow(0, shard.kv_head_start * d, shard.num_kv_heads * d)
    if kind == _MLP_OUT:
        return t.narrow(0, shard.rank * shard.intermediate, shard.intermediate)
    if kind in (_ATTN_IN, _MLP_IN):
        rank = shard.attn_rank if kind == _ATTN_IN else shard.rank
        if is_bias:  # added once, after the sum: rank 0 keeps it
            return t if rank == 0 else torch.zeros_like(t)
        width = shard.num_heads * d if kind == _ATTN_IN else shard.intermediate
        return t.narrow(1, rank * width, width)
    if kind == _VOCAB:
        rows = t[shard.vocab_start : shard.vocab_start + shard.vocab_rows]
        if rows.shape[0] < shard.vocab_rows:  # the padding rows (past the real vocabulary)
            pad = rows.new_zeros(shard.vocab_rows - rows.shape[0], *rows.shape[1:])
            rows = torch.cat([rows, pad])
        return rows
    return t  # norms: every rank keeps the whole tensor


def shard_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor]], cfg: ModelArchConfig, shard: TensorShard
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's (name, tensor) pairs narrowed to this rank's part, lazily."""
    for name, t in weights:
        yield name, shard_tensor(name, t, cfg, shard)


@dataclass
class ShardedModel:
    """One rank's loaded part of the model and what the model runner needs beside it."""

    model: LlamaForCausalLM
    kv_heads: int  # KV heads this rank's pool holds
    lm_head: ParallelLMHead | None  # None under DP attention: each rank has the whole head
    dp_sync: DPAttentionSync | None  # DP attention only


def load_sharded_model(
    folder: str,
    cfg: ModelArchConfig,
    dtype: torch.dtype,
    device: str | torch.device,
    max_positions: int,
    native: FusedLayerOps | None,
    gemm: NativeKernels | None,
    tp: TensorParallelGroup,
    dp_attention: bool = False,
) -> ShardedModel:
    """This rank's decoder, filled from its part of the checkpoint."""
    if cfg.architecture not in LLAMA_FAMILY:
        raise InvalidRequestError(
            f"--tp-size > 1 serves the Llama family ({', '.join(sorted(LLAMA_FAMILY))}), "
            f"not {cfg.architecture}",
            "tp_size",
        )
    if torch.device(device).type != "cpu":
        raise InvalidRequestError(
            "--tp-size > 1 runs on CPU ranks over gloo (--device cpu)", "device"
        )
    if dp_attention:
        shard = dp_attention_shard(cfg, tp.rank, tp.size)
    else:
        shard = tensor_shard(cfg, tp.rank, tp.size)
    model = LlamaForCausalLM.create(shard_config(cfg, shard), dtype, device, max_positions)
    model.load_weights(shard_checkpoint(iter_weights(folder), cfg, shard))
    if dp_attention:
        sync = parallelize_dp_attention(model, tp)
        model.prepack(native, gemm)
        release_freed_memory()  # the packed layers' dense copies
        return ShardedModel(model, shard.num_kv_heads, None, sync)
    parallelize_model(model, tp, shard)
    model.prepack(native, gemm)
    release_freed_memory()
    head = ParallelLMHead(model.lm_head_weight, tp, cfg.vocab_size)
    return ShardedModel(model, shard.num_kv_heads, head, None)
