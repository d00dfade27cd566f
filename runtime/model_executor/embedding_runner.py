"""Load an encoder embedding model (or cross-encoder) and turn batches of token-id sequences
into vectors (or relevance scores) (scheduler process).

The encoder's counterpart of `ModelRunner`: no KV pool, no sampler. A batch is sorted by length
and cut into padded sub-batches of at most `max_batch_tokens` padded tokens, so one long input
does not make every short one pay for its padding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from radixgen.runtime.layers.pooling import finish_vector, pool
from radixgen.runtime.model_loader.weights import iter_weights
from radixgen.runtime.models.bert import BertModel
from radixgen.runtime.models.encoder_config import EncoderArchConfig
from radixgen.runtime.models.sentence_config import PoolingConfig

logger = logging.getLogger(__name__)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class EmbeddingJob:
    """One sequence to embed: its ids, the Matryoshka width asked for (None: the full one) and,
    for a cross-encoder's (query, document) pair, the segment ids."""

    input_ids: list[int]
    dimensions: int | None = None
    token_type_ids: list[int] | None = None


def encoder_dtype(flag: str) -> torch.dtype:
    """`--dtype`; auto is float32: encoders are small and served for similarity, where bf16's
    rounding costs more fidelity than its speed is worth."""
    return torch.float32 if flag == "auto" else _DTYPES[flag]


def encoder_device(flag: str) -> torch.device:
    if flag == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(flag)


def _default_batch_tokens(device: torch.device) -> int:
    """Padded tokens per forward: on the CPU ~2,048, where the MLP's 4x-wide activation (12 MB
    for a 384-wide model) still fits in the last-level cache; measured on all-MiniLM-L6-v2 over
    256 texts, 2,048 ran 1.10-1.18x faster than 8,192 (GELU alone: 2.0 ms a 2,048-row block
    against 23.7 ms for four times the rows). A GPU wants larger launches."""
    return 2048 if device.type == "cpu" else 8192


class EmbeddingRunner:
    """The encoder, its pooling and its limits."""

    def __init__(
        self,
        folder: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        pooling_override: str | None = None,
        max_batch_tokens: int | None = None,
    ) -> None:
        self.cfg = EncoderArchConfig.from_folder(folder)
        self.pooling = PoolingConfig.from_folder(folder, "cls", pooling_override)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_batch_tokens = max_batch_tokens or _default_batch_tokens(self.device)
        self.last_cached_tokens: list[int] = []  # per job of the last `embed`: an encoder, none
        self.model = BertModel.create(self.cfg, dtype, self.device)
        self.model.load_weights(iter_weights(folder))
        logger.info(
            "%s: %s pooling%s from %s, inputs up to %d tokens",
            self.cfg.architecture,
            self.pooling.mode,
            " + L2 norm" if self.pooling.normalize else "",
            self.pooling.source,
            self.max_input_tokens,
        )

    cached_tokens = 0  # an encoder sees its whole input at once: no prefix is ever reused

    def flush_cache(self) -> int:
        """Nothing is cached (the `DecoderEmbeddingRunner` contract); 0 tokens freed."""
        return 0

    @property
    def max_input_tokens(self) -> int:
        """The longest input served: the sentence-transformers limit, else the position table."""
        table = self.cfg.max_tokens
        own = self.pooling.max_seq_length
        return min(own, table) if own else table

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def is_cross_encoder(self) -> bool:
        return self.cfg.is_cross_encoder

    @property
    def hidden_size(self) -> int:
        """The width of what `embed` returns: the vector, or a cross-encoder's one score."""
        return self.cfg.num_labels if self.cfg.is_cross_encoder else self.cfg.hidden_size

    def embed(self, jobs: list[EmbeddingJob]) -> list[torch.Tensor]:
        """One float32 vector per job, in the jobs' order (on the CPU); a cross-encoder's is its
        relevance score, sigmoid of its logit (sentence-transformers' CrossEncoder default)."""
        order = sorted(range(len(jobs)), key=lambda i: len(jobs[i].input_ids))
        out: list[torch.Tensor | None] = [None] * len(jobs)
        start = 0
        while start < len(order):
            end = start + 1  # the longest so far is the last: padded size = count x its length
            while end < len(order):
                longest = len(jobs[order[end]].input_ids)
                if (end - start + 1) * longest > self.max_batch_tokens:
                    break
                end += 1
            group = order[start:end]
            vectors = self._forward([jobs[i] for i in group])
            for row, i in enumerate(group):
                if self.cfg.is_cross_encoder:
                    out[i] = torch.sigmoid(vectors[row])
                else:
                    out[i] = finish_vector(vectors[row], self.pooling.normalize, jobs[i].dimensions)
            start = end
        return [v for v in out if v is not None]

    def _forward(self, jobs: list[EmbeddingJob]) -> torch.Tensor:
        """[B, H] float32 pooled vectors (a cross-encoder: [B, 1] logits) of the jobs, padded
        to the longest."""
        n = max(len(j.input_ids) for j in jobs)
        ids = torch.full((len(jobs), n), self.cfg.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), n), dtype=torch.long)
        with_types = any(j.token_type_ids is not None for j in jobs)
        types = torch.zeros((len(jobs), n), dtype=torch.long) if with_types else None
        for row, j in enumerate(jobs):
            ids[row, : len(j.input_ids)] = torch.tensor(j.input_ids, dtype=torch.long)
            mask[row, : len(j.input_ids)] = 1
            if types is not None and j.token_type_ids is not None:
                types[row, : len(j.token_type_ids)] = torch.tensor(j.token_type_ids)
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(ids, mask, None if types is None else types.to(self.device))
        if self.cfg.is_cross_encoder:
            scores: torch.Tensor = self.model.score(hidden)
            return scores.cpu()
        return pool(hidden, mask, self.pooling.mode).cpu()
