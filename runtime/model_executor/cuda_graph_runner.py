"""Decode steps replayed from CUDA graphs, one graph per captured batch size (scheduler process).

Eager decode on a GPU is bound by kernel launches (~15 ms a step for the default model at any
batch size): a graph replays the whole step, embeddings to lm head, in one launch. A batch of n
rows replays the smallest captured size >= n; the rows beyond n are padding. Every graph reads
the same static input buffers (sized for the largest bucket) and writes its own static outputs;
sampling stays outside the graph. Built by the ModelRunner on CUDA only (never on CPU).

The bucket list and the padding layout are plain functions on any device, tested on CPU.
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.device_io import upload
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.logits_output import LogitsOutput

if TYPE_CHECKING:
    from radixgen.kernels.attention import AttentionBackend
    from radixgen.runtime.models.causal_lm import CausalLM

logger = logging.getLogger(__name__)

# NOTE: padding rows read request slot 0's first position (read only: slot 0 may be a live
# request's) and write their K/V into KV slot 0, the pool's padding page, which every reader
# masks; their outputs are never returned.
PAD_REQ_ROW = 0
PAD_KV_SLOT = 0
PAD_SEQ_LEN = 1
PAD_TOKEN = 0
WARMUP_STEPS = 2  # eager runs of each shape before its capture (Triton compiles on the first)


def capture_batch_sizes(
    max_bs: int, explicit: Sequence[int] | None, max_running_requests: int
) -> list[int]:
    """The decode batch sizes to capture, ascending (SGLang's buckets).

    Default: 1, 2, 4, 8, 12, then every 8 to 256, every 16 to 512, every 32 beyond, up to
    `max_bs` and `max_running_requests` (no batch is larger), plus that cap itself. `explicit`
    (`--cuda-graph-bs`) replaces the list; only `max_running_requests` caps it.
    """
    if explicit:
        return sorted({b for b in explicit if 1 <= b <= max_running_requests}) or [1]
    cap = max(1, min(max_bs, max_running_requests))
    sizes = [1, 2, 4, 8, 12]
    sizes += range(16, 257, 8)
    sizes += range(272, 513, 16)
    sizes += range(544, cap + 1, 32)
    kept = [b for b in sizes if b <= cap]
    if kept[-1] != cap:
        kept.append(cap)
    return kept


def bucket_for(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size >= n (`sizes` ascending), or None past the largest."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def padded(values: Sequence[int], bs: int, fill: int) -> list[int]:
    """`values` followed by `fill` up to `bs` entries."""
    assert len(values) <= bs
    return [*values, *([fill] * (bs - len(values)))]


@dataclass
class StaticDecodeInputs:
    """The buffers every decode graph reads, at fixed addresses, sized for the largest bucket."""

    input_ids: torch.Tensor  # [max_bs] long
    positions: torch.Tensor  # [max_bs] long
    out_cache_loc: torch.Tensor  # [max_bs] long: the new token's KV slot
    lens: torch.Tensor  # [2, max_bs] int32: request rows, then sequence lengths (one copy in)

    @classmethod
    def allocate(cls, max_bs: int, device: torch.device | str) -> StaticDecodeInputs:
        def longs() -> torch.Tensor:
            return torch.zeros(max_bs, dtype=torch.long, device=device)

        lens = torch.zeros((2, max_bs), dtype=torch.int32, device=device)
        return cls(longs(), longs(), longs(), lens)

    @property
    def capacity(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def req_rows(self) -> torch.Tensor:
        return self.lens[0]

    @property
    def seq_lens(self) -> torch.Tensor:
        return self.lens[1]


def fill_static_inputs(
    static: StaticDecodeInputs,
    bs: int,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    req_rows: Sequence[int],
    seq_lens: Sequence[int],
) -> list[int]:
    """Copy one decode step of n = len(req_rows) rows into the first `bs` static rows; rows n to
    bs get the padding (request slot 0, KV slot 0, sequence length 1, position 0, token 0).

    The tensors may live on the host or the device; returns the `bs` sequence lengths on the
    host (what `init_forward_metadata_graph` takes as `seq_lens_host`).
    """
    n = len(req_rows)
    assert len(seq_lens) == n and n <= bs <= static.capacity, (n, bs, static.capacity)
    for dst, src, fill in (
        (static.input_ids, input_ids, PAD_TOKEN),
        (static.positions, positions, 0),
        (static.out_cache_loc, out_cache_loc, PAD_KV_SLOT),
    ):
        assert src.shape == (n,), src.shape
        dst[:n].copy_(upload(src, dst.device))
        if bs > n:
            dst[n:bs].fill_(fill)
    lens_host = padded(seq_lens, bs, PAD_SEQ_LEN)
    host = torch.tensor([padded(req_rows, bs, PAD_REQ_ROW), lens_host], dtype=torch.int32)
    static.lens[:, :bs].copy_(upload(host, static.lens.device))
    return lens_host


def runs_in_graph(batch: ForwardBatch, max_bs: int) -> bool:
    """A decode-only batch of 1 to max_bs rows asking for every row's logits, in order."""
    n = batch.batch_size
    if not (0 < n <= max_bs and batch.is_decode_only):
        return False
    idx = batch.logits_indices
    if idx is None:
        return True
    if idx.numel() != n:
        return False
    # NOTE: a decode row has one token, so n rows asked for is every row, in order, unless
    # some row asked for two; checked exactly where that costs no device sync
    return idx.device.type != "cpu" or bool(torch.equal(idx, torch.arange(n)))


def decode_batch_of(static: StaticDecodeInputs, bs: int) -> ForwardBatch:
    """A ForwardBatch over the first `bs` static rows (what a graph of size `bs` is captured on;
    its host lists are placeholders: nothing in the graph reads them)."""
    return ForwardBatch(
        input_ids=static.input_ids[:bs],
        positions=static.positions[:bs],
        out_cache_loc=static.out_cache_loc[:bs],
        req_pool_indices_cpu=[PAD_REQ_ROW] * bs,
        prefix_lens=[PAD_SEQ_LEN - 1] * bs,
        extend_lens=[1] * bs,
        extend_start_loc=list(range(bs)),
        logits_indices=None,
    )


@contextmanager
def _gc_paused() -> Iterator[None]:
    """A collection during capture could free tensors a graph's pool still hands out."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CudaGraphRunner:
    """Captures model.forward + the lm head for each batch size and replays decode steps."""

    def __init__(
        self,
        model: CausalLM,
        attn_backend: AttentionBackend,
        batch_sizes: Sequence[int],
        vocab_size: int,
        max_context_len: int,
        device: torch.device | str,
    ) -> None:
        assert attn_backend.supports_cuda_graph, type(attn_backend).__name__
        self.model = model
        self.attn_backend = attn_backend
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_bs = self.batch_sizes[-1]
        self.vocab_size = vocab_size
        self.static = StaticDecodeInputs.allocate(self.max_bs, device)
        attn_backend.init_cuda_graph_state(self.max_bs, max_context_len)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # bs -> (hidden [bs, hidden], logits [bs, >= vocab]): each graph's static outputs
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        t0 = time.perf_counter()
        self._capture_all()
        self.capture_seconds = time.perf_counter() - t0
        logger.info(
            "CUDA graphs captured for %d decode batch sizes (1 to %d) in %.1f s",
            len(self.batch_sizes),
            self.max_bs,
            self.capture_seconds,
        )

    def can_run(self, batch: ForwardBatch) -> bool:
        return runs_in_graph(batch, self.max_bs)

    def _step(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = decode_batch_of(self.static, bs)
        batch.attn_backend = self.attn_backend
        hidden = self.model.forward(batch.input_ids, batch.positions, batch)
        return hidden, self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        static = self.static
        empty = torch.empty(0, dtype=torch.long)
        fill_static_inputs(static, static.capacity, empty, empty, empty, [], [])
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # unannotated in torch
        with _gc_paused():
            # NOTE: the largest first: the smaller graphs then reuse its pool memory
            for bs in reversed(self.batch_sizes):
                self.attn_backend.init_forward_metadata_graph(
                    bs, static.req_rows[:bs], static.seq_lens[:bs], [PAD_SEQ_LEN] * bs
                )
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(WARMUP_STEPS):
                        self._step(bs)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[bs] = self._step(bs)
                self.graphs[bs] = graph
        torch.cuda.synchronize()

    def replay(self, batch: ForwardBatch) -> LogitsOutput:
        """The step's logits for a batch `can_run` accepted.

        NOTE: the result's tensors are views of the graph's static outputs, and the next replay
        (of any size: the graphs share one memory pool) may overwrite them, so they must be
        consumed (sampled, or copied) before the next step is launched on the same stream.
        """
        n = batch.batch_size
        bs = bucket_for(n, self.batch_sizes)
        assert bs is not None, f"a batch of {n} rows is past the largest graph ({self.max_bs})"
        static = self.static
        seq_lens = [p + 1 for p in batch.prefix_lens]  # the new token is in the pool by then
        lens_host = fill_static_inputs(
            static,
            bs,
            batch.input_ids,
            batch.positions,
            batch.out_cache_loc,
            batch.req_pool_indices_cpu,
            seq_lens,
        )
        batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata_graph(
            bs, static.req_rows[:bs], static.seq_lens[:bs], lens_host
        )
        self.graphs[bs].replay()
        hidden, logits = self.outputs[bs]
        # the near-max refinement re-scores from these very hidden rows (the graph's output)
        return LogitsOutput(
            logits[:n], hidden[:n], self.model.lm_head_weight, self.vocab_size, None
        )
