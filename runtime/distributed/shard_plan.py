"""How a model splits over tensor-parallel ranks: heads, KV heads, MLP columns, vocab rows.

Pure arithmetic (no torch), run by the launcher (to refuse a split before any process starts)
and by every scheduler rank (to build and load its shard).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixgen.errors import InvalidRequestError

if TYPE_CHECKING:
    from radixgen.runtime.models.model_config import ModelArchConfig

VOCAB_PADDING = 64  # vocab rows are padded to a multiple of this (times tp when needed)


@dataclass(frozen=True)
class TensorShard:
    """What one rank holds of the model: its head, MLP and vocab ranges."""

    rank: int
    size: int
    num_heads: int  # q heads on this rank
    num_kv_heads: int  # kv heads on this rank (1 when replicated)
    kv_head_start: int  # first kv head of the checkpoint this rank keeps
    intermediate: int  # MLP columns on this rank
    padded_vocab: int  # the whole padded vocabulary
    vocab_start: int  # this rank's vocab rows [vocab_start, vocab_start + vocab_rows)
    vocab_rows: int
    # this rank's index among the ranks that split the attention heads (0 under DP attention,
    # where every rank holds all of them)
    attn_rank: int


def padded_vocab_size(vocab: int, tp: int) -> int:
    """Round up to a multiple of 64, or of 64 * tp when that multiple does not split evenly."""
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        step = VOCAB_PADDING * tp
        padded = -(-vocab // step) * step
    return padded


def check_tp_shape(cfg: ModelArchConfig, tp: int) -> None:
    """Refuse a split the model's shape does not allow, naming the numbers."""
    if tp < 1:
        raise InvalidRequestError("tp_size must be >= 1", "tp_size")
    if cfg.num_heads % tp:
        raise InvalidRequestError(
            f"--tp-size {tp} does not divide the model's {cfg.num_heads} attention heads", "tp_size"
        )
    hkv = cfg.num_kv_heads
    if hkv % tp and tp % hkv:
        raise InvalidRequestError(
            f"--tp-size {tp} and the model's {hkv} KV heads: one must divide the other", "tp_size"
        )
    if cfg.intermediate_size % tp:
        raise InvalidRequestError(
            f"--tp-size {tp} does not divide the model's MLP size {cfg.intermediate_size}",
            "tp_size",
        )


def tensor_shard(cfg: ModelArchConfig, rank: int, tp: int) -> TensorShard:
    """Rank `rank`'s part of the model. KV heads are split when there are at least tp of them,
    else each rank keeps one, replicated tp / Hkv times (rank r keeps head r // replicas)."""
    check_tp_shape(cfg, tp)
    hkv = cfg.num_kv_heads
    if hkv >= tp:
        local_kv, kv_start = hkv // tp, rank * (hkv // tp)
    else:
        local_kv, kv_start = 1, rank // (tp // hkv)
    padded = padded_vocab_size(cfg.vocab_size, tp)
    return TensorShard(
        rank, tp, cfg.num_heads // tp, local_kv, kv_start, cfg.intermediate_size // tp,
        padded, rank * (padded // tp), padded // tp, rank,
    )  # fmt: skip


def check_dp_attention_shape(cfg: ModelArchConfig, tp: int) -> None:
    if cfg.intermediate_size % tp:
        raise InvalidRequestError(
            f"--tp-size {tp} does not divide the model's MLP size {cfg.intermediate_size}",
            "tp_size",
        )


def dp_attention_shard(cfg: ModelArchConfig, rank: int, tp: int) -> TensorShard:
    """Under DP attention every rank keeps the whole attention, embedding and LM head (it runs
    them on its own requests) and 1/tp of the MLP columns (run over every rank's tokens)."""
    check_dp_attention_shape(cfg, tp)
    v = cfg.vocab_size
    return TensorShard(
        rank, tp, cfg.num_heads, cfg.num_kv_heads, 0, cfg.intermediate_size // tp, v, 0, v, 0
    )


def shard_config(cfg: ModelArchConfig, shard: TensorShard) -> ModelArchConfig:
    """The config of the model one rank builds: local heads, MLP columns and vocab rows (the
    head size stays; the decoder code then needs no knowledge of the split)."""
    return dataclasses.replace(
        cfg,
        num_heads=shard.num_heads,
        num_kv_heads=shard.num_kv_heads,
        intermediate_size=shard.intermediate,
        vocab_size=shard.vocab_rows,
    )
