"""Build scheduler-side `Req` objects and KV pools for unit tests (no model, no processes)."""

from __future__ import annotations

import torch

from radixgen.io_struct import TokenizedGenerateReq
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.scheduler.req import Req
from radixgen.sampling_params import SamplingParams


def make_req(rid: str, input_ids: list[int], arrival_time: float = 0.0) -> Req:
    """A real Req, built the way the scheduler builds it from a TokenizedGenerateReq."""
    msg = TokenizedGenerateReq(rid, list(input_ids), SamplingParams(), arrival_time=arrival_time)
    return Req(msg, default_seed=0)


def make_pools(
    max_total_tokens: int, page_size: int = 1, max_requests: int = 8, max_context_len: int = 64
) -> tuple[ReqToTokenPool, TokenToKVPool]:
    """A request-slot table and a one-layer float32 KV pool (tiny tensors; only slots matter)."""
    kv_pool = TokenToKVPool(max_total_tokens, page_size, 1, 1, 2, torch.float32)
    return ReqToTokenPool(max_requests, max_context_len), kv_pool
