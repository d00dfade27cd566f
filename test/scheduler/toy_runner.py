"""A toy model runner over real KV pools, so the Scheduler's planning is tested in milliseconds.

`ToyRunner.forward` writes each new token's id into its KV slot and predicts the next token from
the whole sequence *read back through req_to_token* (a position-weighted sum of its ids). A step
whose cancel flag is set writes a wrong id into its slots and raises StepCancelled, as a real
forward cut between layers leaves KV behind. A scheduling
bug that loses, shares or reorders KV (a wrong prefix match, a retraction, a chunk boundary, an
eviction of a locked node) changes the outputs, which `reference_output` computes from the token
list alone.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from radixgen.io_struct import TokenizedGenerateReq, apply_delta
from radixgen.kernels.step_cancel import StepCancelled
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.logits_output import LogitsOutput
from radixgen.runtime.scheduler.scheduler import ModelLimits, Scheduler
from radixgen.runtime.scheduler.scheduler_process import create_prefix_cache
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import ServerArgs

VOCAB = 50
EOS = 0
CONTEXT = 4096


def next_token(ids: list[int]) -> int:
    """The toy model: a function of the whole sequence and its order, never EOS."""
    return sum((i + 1) * t for i, t in enumerate(ids)) % (VOCAB - 1) + 1


def reference_output(prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = list(prompt)
    for _ in range(max_new_tokens):
        ids.append(next_token(ids))
    return ids[len(prompt) :]


class ToyRunner:
    """Implements the scheduler's `StepRunner` protocol."""

    def __init__(self, kv_pool: TokenToKVPool, req_to_token_pool: ReqToTokenPool) -> None:
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        self.batches: list[ForwardBatch] = []
        self.predict = next_token  # the toy model (tests of speculation swap in a repetitive one)

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        k = self.kv_pool.k_buffer[0]
        if batch.cancel is not None and batch.cancel.is_set():
            k[batch.out_cache_loc, 0, 0] = -7.0  # the KV a real forward wrote before its cut
            raise StepCancelled
        self.batches.append(batch)
        k[batch.out_cache_loc, 0, 0] = batch.input_ids.float()
        assert batch.logits_indices is not None
        rows = []
        for flat in batch.logits_indices.tolist():
            i = max(j for j, s in enumerate(batch.extend_start_loc) if s <= flat)
            pos = batch.prefix_lens[i] + flat - batch.extend_start_loc[i]
            row = batch.req_pool_indices_cpu[i]
            slots = self.req_to_token_pool.req_to_token[row, : pos + 1]
            ids = [int(x) for x in k[slots, 0, 0].tolist()]
            rows.append(self.predict(ids))
        logits = torch.zeros(len(rows), VOCAB)
        logits[torch.arange(len(rows)), torch.tensor(rows, dtype=torch.long)] = 1.0
        empty = torch.empty(0)
        return LogitsOutput(logits, empty, empty, VOCAB, None)


class ToyDecoder:
    """Implements `TextDecoder`: token i is the letter chr(ord('a') + i % 26)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def make_scheduler(
    pool_tokens: int = 2048, grammars: Any = None, **flags: object
) -> tuple[Scheduler, ToyRunner]:
    """A Scheduler over real pools and cache with the toy runner; flags as engine kwargs;
    `grammars` stands in for the GrammarManager."""
    flags.setdefault("grammar_backend", "none")
    flags.setdefault("debug_invariants", True)
    args = ServerArgs.from_kwargs(max_total_tokens=pool_tokens, **flags)
    page = args.cache.page_size
    kv = TokenToKVPool(pool_tokens, page, 1, 1, 1, torch.float32)
    rows = ReqToTokenPool(args.scheduler.max_running_requests + 8, CONTEXT + 8)
    runner = ToyRunner(kv, rows)
    cache = create_prefix_cache(args, rows, kv)
    limits = ModelLimits(CONTEXT, VOCAB, [EOS])
    return Scheduler(args, runner, ToyDecoder(), cache, grammars, limits), runner


def submit(
    s: Scheduler,
    rid: str,
    prompt: list[int],
    max_new_tokens: int = 8,
    stream: bool = False,
    **params: Any,
) -> None:
    sp = SamplingParams.from_dict({"max_new_tokens": max_new_tokens, "temperature": 0, **params})
    msg = TokenizedGenerateReq(rid, list(prompt), sp, stream=stream, arrival_time=time.time())
    s.add_request(msg)


def run_to_end(s: Scheduler, max_steps: int = 10_000) -> dict[str, tuple[list[int], object]]:
    """Step until idle; return {rid: (output ids, finish reason)}."""
    out: dict[str, tuple[list[int], object]] = {}
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not (s.has_work or s.grammar_waiting):  # compiling requests are not `has_work`
            return out
        for batch in s.step():
            for d in batch.deltas:
                toks = apply_delta(tokens.setdefault(d.rid, []), d)
                if d.finished_reason is not None:
                    out[d.rid] = (toks, d.finished_reason)
    raise AssertionError("the scheduler did not go idle")
