"""Decoder embedding models (the Qwen3-Embedding / e5-mistral kind) and yes/no rerankers (the
Qwen3-Reranker kind) on our decoder stack: last-token pooling, or the answer tokens' odds, over
one prefill (scheduler process).

The model is loaded by a `ModelRunner` (the same weights, kernels and paged attention as a
generation server); each batch borrows request rows and KV slots for its prefill and gives them
back at once: nothing is kept, so there is no prefix reuse yet. The hidden state read is the
last token's after the final norm, the one transformers' `last_hidden_state` gives.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from radixgen.errors import InvalidRequestError
from radixgen.runtime.layers.pooling import finish_vector
from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.models.sentence_config import PoolingConfig
from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)


class DecoderEmbeddingRunner:
    """A decoder, its last-token pooling and its input limit (the `EmbeddingRunner` contract).

    answer_ids: (yes, no) token ids of a yes/no reranker; each input's "vector" is then its one
    score, p(yes) / (p(yes) + p(no)) at the next token."""

    def __init__(
        self,
        folder: str | Path,
        args: ServerArgs,
        pooling_override: str | None,
        answer_ids: tuple[int, int] | None = None,
    ) -> None:
        self.answer_ids = answer_ids
        self.arch = ModelArchConfig.from_folder(folder)
        self.pooling = PoolingConfig.from_folder(folder, "last", pooling_override)
        if self.pooling.mode != "last":
            raise InvalidRequestError(
                f"{self.arch.architecture} embeds with last-token pooling only, "
                f"not {self.pooling.mode!r} (from {self.pooling.source})",
                "pooling",
            )
        context = args.model.context_length or self.arch.max_position_embeddings
        self.runner = ModelRunner(str(folder), args, context, self.arch)
        self.dtype = self.runner.dtype
        own = self.pooling.max_seq_length
        self.max_input_tokens = min(context, own or context, self.runner.kv_pool.size)
        logger.info(
            "%s: last-token pooling%s, inputs up to %d tokens",
            self.arch.architecture,
            " + L2 norm" if self.pooling.normalize else "",
            self.max_input_tokens,
        )

    @property
    def is_cross_encoder(self) -> bool:
        """Whether it scores (query, document) prompts (/v1/rerank) rather than embedding."""
        return self.answer_ids is not None

    @property
    def hidden_size(self) -> int:
        """The width of what `embed` returns: the vector, or a reranker's one score."""
        return 1 if self.answer_ids is not None else self.arch.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size

    def embed(self, jobs: list[EmbeddingJob]) -> list[torch.Tensor]:
        """One float32 vector per job, in order; groups fit the KV pool (each at most its size)."""
        out: list[torch.Tensor] = []
        start = 0
        while start < len(jobs):
            end, tokens = start, 0
            while end < len(jobs) and (
                end == start or tokens + len(jobs[end].input_ids) <= self.max_input_tokens
            ):
                tokens += len(jobs[end].input_ids)
                end += 1
            hidden = self._last_states([j.input_ids for j in jobs[start:end]])
            if self.answer_ids is not None:
                out.extend(self._answer_scores(hidden))
                start = end
                continue
            for row, job in enumerate(jobs[start:end]):
                vec = hidden[row].float()
                out.append(finish_vector(vec, self.pooling.normalize, job.dimensions))
            start = end
        return out

    def _answer_scores(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """p(yes) against p(no) at the next token of each row: softmax over the two logits."""
        assert self.answer_ids is not None
        logits = self.runner.model.compute_logits(hidden.to(self.runner.torch_device)).float()
        pair = logits[:, list(self.answer_ids)].cpu()
        return list(torch.softmax(pair, dim=-1)[:, :1])

    def _last_states(self, seqs: list[list[int]]) -> torch.Tensor:
        """[B, H] in the model dtype: each sequence's last hidden state (after the final norm),
        from one prefill of them all."""
        runner = self.runner
        rows: list[int] = []
        slots: list[torch.Tensor] = []
        try:
            for seq in seqs:
                row = runner.req_to_token_pool.alloc()
                locs = runner.kv_pool.alloc(len(seq))
                if row is None or locs is None:
                    raise RuntimeError("the KV pool is short for an embedding batch")
                rows.append(row)
                slots.append(locs)
                runner.req_to_token_pool.write_row(row, 0, locs)
            lens = [len(s) for s in seqs]
            starts = [sum(lens[:i]) for i in range(len(seqs))]
            batch = ForwardBatch(
                torch.tensor([t for s in seqs for t in s]),
                torch.cat([torch.arange(n) for n in lens]),
                torch.cat(slots),
                rows,
                [0] * len(seqs),
                lens,
                starts,
                torch.tensor([s + n - 1 for s, n in zip(starts, lens, strict=True)]),
            ).to_device(runner.torch_device)
            batch.attn_backend = runner.attn_backend
            runner.attn_backend.init_forward_metadata(batch)
            hidden: torch.Tensor = runner.model(batch.input_ids, batch.positions, batch)
            return hidden.cpu()
        finally:
            for locs in slots:
                runner.kv_pool.free(locs)
            for row in rows:
                runner.req_to_token_pool.free(row)
