"""Decoder embedding models (the Qwen3-Embedding / e5-mistral kind) and yes/no rerankers (the
Qwen3-Reranker kind) on our decoder stack: last-token pooling, or the answer tokens' odds, over
one prefill, run in forwards of at most `--chunked-prefill-size` tokens (scheduler process).

The model is loaded by a `ModelRunner` (the same weights, kernels and paged attention as a
generation server); each batch borrows request rows for its prefill. Prompts of such models
share long prefixes: an embedder's task instruction before every query, a reranker's template
and query before every document. So a radix tree (`RadixCache`, as the generation scheduler's)
keeps the KV of what was embedded while the pool has room: a prompt reuses its longest cached
prefix and prefills only the rest; within one batch, a prompt sharing MIN_SHARED_TOKENS more
with an earlier first-pass prompt than the tree holds waits for a second pass, after the first
has cached that prompt (a rerank request's documents all follow one query: one runs first, the
rest reuse its template and query; see `_passes`). Unlocked entries are evicted LRU when a batch needs
slots; `--disable-radix-cache` keeps nothing. The hidden state read is the last token's after
the final norm, the one transformers' `last_hidden_state` gives.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from radixgen.errors import InvalidRequestError
from radixgen.runtime.layers.pooling import finish_vector
from radixgen.runtime.mem_cache.radix_cache import RadixCache, TreeNode, common_prefix_len
from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.models.sentence_config import PoolingConfig
from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)

# a prompt sharing at least this many more tokens with another of its batch than with the tree
# waits for a second forward pass (which then reuses them); fewer are not worth the extra pass
MIN_SHARED_TOKENS = 32


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
        runner = self.runner
        self.cache: RadixCache | None = None
        if not args.cache.disable_radix_cache:
            self.cache = RadixCache(runner.req_to_token_pool, runner.kv_pool, args.cache.page_size)
        # most prompt tokens in one forward (--chunked-prefill-size; -1: a batch at once)
        self.chunk_tokens = args.scheduler.chunked_prefill_size
        self.cached_tokens = 0  # prompt tokens served from the tree, since the start
        self.last_cached_tokens: list[int] = []  # per job of the last `embed` call
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
        """One float32 vector per job, in order; groups hold at most the KV pool's size in tokens
        (with pages, many short inputs can still need more pages than the pool has: that step
        fails with a 500, as it did before the tree)."""
        out: list[torch.Tensor] = []
        self.last_cached_tokens = []
        start = 0
        while start < len(jobs):
            end, tokens = start, 0
            while end < len(jobs) and (
                end == start or tokens + len(jobs[end].input_ids) <= self.max_input_tokens
            ):
                tokens += len(jobs[end].input_ids)
                end += 1
            hidden, cached = self._last_states([j.input_ids for j in jobs[start:end]])
            self.last_cached_tokens += cached
            self.cached_tokens += sum(cached)
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

    def flush_cache(self) -> int:
        """Drop every cached prefix (none is locked between batches); returns the tokens freed."""
        return 0 if self.cache is None else self.cache.evict(self.cache.evictable_size())

    def _last_states(self, seqs: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """[B, H] in the model dtype: each sequence's last hidden state (after the final norm),
        from one prefill of them all, or two (see the module docstring); and how many of each
        sequence's tokens came from the tree."""
        out: list[torch.Tensor | None] = [None] * len(seqs)
        cached = [0] * len(seqs)
        for indices in self._passes(seqs):
            hidden, reused = self._prefill([seqs[i] for i in indices])
            for row, i in enumerate(indices):
                out[i], cached[i] = hidden[row], reused[row]
        return torch.stack([h for h in out if h is not None]), cached

    def _passes(self, seqs: list[list[int]]) -> list[list[int]]:
        """The batch's indices per forward pass. In lexicographic order (which puts sequences
        beside those they share most with), each first-pass sequence leads the ones after it:
        a sequence whose shared part with its leader is MIN_SHARED_TOKENS more than the tree
        holds of it (both in whole pages) goes second and reuses what the leader caches; any
        other sequence runs first and leads."""
        if self.cache is None or len(seqs) < 2:
            return [list(range(len(seqs)))]
        page = self.cache.page_size
        order = sorted(range(len(seqs)), key=lambda i: seqs[i])
        leader, first, second = order[0], [order[0]], list[int]()
        for i in order[1:]:
            shared = common_prefix_len(seqs[leader][:-1], seqs[i][:-1])
            shared -= shared % page
            cached = len(self.cache.match_prefix(seqs[i][:-1]).indices) if shared else 0
            if shared - cached >= MIN_SHARED_TOKENS:
                second.append(i)
            else:
                first.append(i)
                leader = i
        return [first, second] if second else [first]

    def _alloc(self, n: int) -> torch.Tensor:
        """n fresh KV slots, evicting cached prefixes (least recently used first) for room."""
        pool = self.runner.kv_pool
        locs = pool.alloc(n)
        if locs is None and self.cache is not None:
            self.cache.evict(n + pool.page_size - pool.available_size())  # whole pages
            locs = pool.alloc(n)
        if locs is None:
            raise RuntimeError("the KV pool is short for an embedding batch")
        return locs

    def _prefill(self, seqs: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """[B, H] and the prefix lengths: one extend of the sequences over their cached prefixes
        (each keeps at least its last token to compute); afterwards their KV goes into the tree,
        or back."""
        runner, cache = self.runner, self.cache
        rows: list[int] = []
        matches: list[tuple[torch.Tensor, TreeNode | None]] = []  # (prefix slots, locked node)
        fresh: list[torch.Tensor] = []
        try:
            for seq in seqs:
                if cache is not None:
                    match = cache.match_prefix(seq[:-1])
                    cache.inc_lock_ref(match.last_node)
                    matches.append((match.indices, match.last_node))
                else:
                    matches.append((torch.empty(0, dtype=torch.long), None))
            for seq, (prefix, _) in zip(seqs, matches, strict=True):
                row = runner.req_to_token_pool.alloc()
                if row is None:
                    raise RuntimeError("no request row is free for an embedding batch")
                rows.append(row)
                fresh.append(self._alloc(len(seq) - len(prefix)))
                runner.req_to_token_pool.write_row(row, 0, prefix)
                runner.req_to_token_pool.write_row(row, len(prefix), fresh[-1])
            prefix_lens = [len(prefix) for prefix, _ in matches]
            hidden = self._forward_in_chunks(seqs, rows, prefix_lens, fresh)
            if cache is not None:
                for i, (seq, (prefix, _)) in enumerate(zip(seqs, matches, strict=True)):
                    locs = fresh[i]
                    fresh[i] = prefix[:0]  # the tree holds them now, or `_keep` frees them
                    self._keep(seq, torch.cat((prefix, locs)), len(prefix))
            return hidden.cpu(), prefix_lens
        finally:
            for locs in fresh:
                runner.kv_pool.free(locs)
            for row in rows:
                runner.req_to_token_pool.free(row)
            if cache is not None:
                for _, node in matches:
                    cache.dec_lock_ref(node)

    def _forward_in_chunks(
        self,
        seqs: list[list[int]],
        rows: list[int],
        prefix_lens: list[int],
        fresh: list[torch.Tensor],
    ) -> torch.Tensor:
        """[B, H]: each sequence's last hidden state, computed over its uncached tokens in
        forwards of at most `chunk_tokens` tokens (all when -1): a long input's later chunks
        attend to its earlier ones' KV in the pool, as chunked prefill does in the generation
        scheduler, so no forward's activations grow with the input (one 8,000-token input:
        309 MB of peak memory growth instead of 750). The kernels are batch-invariant: the
        vectors do not depend on the chunking."""
        runner = self.runner
        done = list(prefix_lens)  # tokens of each sequence in the pool so far
        last: list[torch.Tensor | None] = [None] * len(seqs)
        limit = self.chunk_tokens if self.chunk_tokens > 0 else sum(map(len, seqs))
        while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
            part: list[tuple[int, int]] = []  # (sequence, tokens this forward)
            budget = limit
            for i, seq in enumerate(seqs):
                if done[i] < len(seq) and budget > 0:
                    part.append((i, min(len(seq) - done[i], budget)))
                    budget -= part[-1][1]
            lens = [n for _, n in part]
            starts = [sum(lens[:k]) for k in range(len(part))]
            batch = ForwardBatch(
                torch.tensor([t for i, n in part for t in seqs[i][done[i] : done[i] + n]]),
                torch.cat([torch.arange(done[i], done[i] + n) for i, n in part]),
                torch.cat([fresh[i][done[i] - prefix_lens[i] :][:n] for i, n in part]),
                [rows[i] for i, _ in part],
                [done[i] for i, _ in part],
                lens,
                starts,
                torch.tensor([s + n - 1 for s, n in zip(starts, lens, strict=True)]),
            ).to_device(runner.torch_device)
            batch.attn_backend = runner.attn_backend
            runner.attn_backend.init_forward_metadata(batch)
            hidden: torch.Tensor = runner.model(batch.input_ids, batch.positions, batch)
            for k, (i, n) in enumerate(part):
                done[i] += n
                if done[i] == len(seqs[i]):
                    last[i] = hidden[k].clone()  # the next forward may reuse its output
        return torch.stack([h for h in last if h is not None])

    def _keep(self, seq: list[int], slots: torch.Tensor, matched: int) -> None:
        """Insert a computed sequence into the tree (whole pages); free what it already held
        beyond the prefix this sequence matched, and the unaligned tail."""
        assert self.cache is not None
        pool = self.runner.kv_pool
        aligned = len(seq) - len(seq) % self.cache.page_size
        already = self.cache.insert(seq[:aligned], slots[:aligned])
        pool.free(slots[matched:already])
        pool.free(slots[aligned:])
