"""One request's state in the API process (`ReqState`) and SGLang's response dict built from it.

The TokenizerManager's receive loop fills a `ReqState` from the detokenizer's outputs; consumers
read snapshots of it through `build_output` (deltas of logprobs when streaming).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from radixgen.finish_reason import FinishReason
from radixgen.generate_output import GenerateOutput, LogprobEntry, MetaInfo
from radixgen.io_struct import LogprobList, RequestMeta, TopLogprobList
from radixgen.runtime.dashboard.traces import PendingRequest
from radixgen.runtime.text.tokenizer import Tokenizer


@dataclass
class ReqState:
    rid: str
    prompt_tokens: int
    return_logprob: bool
    top_logprobs_num: int
    return_text: bool
    created: float
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    meta: RequestMeta | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    input_token_logprobs: LogprobList = field(default_factory=list)
    input_top_logprobs: list[TopLogprobList | None] = field(default_factory=list)
    output_token_logprobs: LogprobList = field(default_factory=list)
    output_top_logprobs: list[TopLogprobList | None] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    internal: bool = False  # our own n > 1 prompt prefill: not a user request in the metrics
    stream: bool = False  # metrics label requests by it, as SGLang does
    constrained: bool = False  # has a grammar: SGLang's structured-output request count
    trace: PendingRequest | None = None  # a traced program's call: the dashboard's record

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def build_output(
    st: ReqState, output_lp_from: int, tokenizer: Tokenizer, tier_details: bool = False
) -> GenerateOutput:
    """SGLang's response dict; output logprobs from `output_lp_from` on (deltas when streaming);
    `tier_details` (HiCache on): which cache tier served the cached tokens."""
    meta = st.meta
    info: MetaInfo = {
        "id": st.rid,
        "finish_reason": st.finish_reason.to_dict() if st.finish_reason else None,
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": meta.completion_tokens if meta else 0,
        "cached_tokens": meta.cached_tokens if meta else 0,
        "jump_forward_tokens": meta.jump_forward_tokens if meta else 0,
    }
    if tier_details:
        host = meta.host_cached_tokens if meta else 0
        storage = meta.storage_cached_tokens if meta else 0
        info["cached_tokens_details"] = {
            "device": info["cached_tokens"] - host - storage,
            "host": host,
            "storage": storage,
        }
    if meta is not None and meta.grammar_backend is not None:
        info["grammar_backend"] = meta.grammar_backend
    if meta is not None and meta.schema_rewrites:
        info["schema_rewrites"] = list(meta.schema_rewrites)
    if meta is not None and meta.schema_checks:
        info["schema_checks"] = list(meta.schema_checks)
        info["schema_check_rollbacks"] = meta.schema_check_rollbacks
    if st.finished:
        info["e2e_latency"] = (st.finished_time or time.perf_counter()) - st.created
    if st.return_logprob:
        info["input_token_logprobs"] = _lp_entries(
            tokenizer, st.input_token_logprobs, st.return_text
        )
        info["output_token_logprobs"] = _lp_entries(
            tokenizer, st.output_token_logprobs[output_lp_from:], st.return_text
        )
        info["output_token_logprobs_length"] = len(st.output_token_logprobs)
        if st.top_logprobs_num:
            info["input_top_logprobs"] = [
                None if row is None else _lp_entries(tokenizer, row, st.return_text)
                for row in st.input_top_logprobs
            ]
            info["output_top_logprobs"] = [
                _lp_entries(tokenizer, row or [], st.return_text)
                for row in st.output_top_logprobs[output_lp_from:]
            ]
    return {"text": st.text, "output_ids": list(st.output_ids), "meta_info": info}


def _lp_entries(
    tok: Tokenizer, pairs: LogprobList | TopLogprobList, with_text: bool
) -> list[LogprobEntry]:
    """[logprob, token id, token text or None] per pair (SGLang's meta_info entries)."""
    return [[lp, tid, tok.token_text(tid) if with_text else None] for lp, tid in pairs]
