"""Typed messages between RadixGen's processes (pickled over ZMQ between our own processes only).

Down the path (`*Req`): TokenizerManager -> Scheduler. Back (`*Out`): Scheduler -> Detokenizer ->
TokenizerManager, and control replies Scheduler -> TokenizerManager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixgen.sampling_params import SamplingParams

# A finish reason is a plain dict in SGLang's shape:
#   {"type": "stop", "matched": str | int}, {"type": "length", "length": N},
#   {"type": "abort", "message": str, "status_code": int}
FinishReason = dict[str, Any]

# (logprob, token_id) pairs; the API process adds token text when asked.
LogprobList = list[tuple[float | None, int]]


@dataclass
class TokenizedGenerateReq:
    """One sequence to generate (n > 1 arrives as n of these sharing a prompt)."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    arrival_time: float = 0.0


@dataclass
class AbortReq:
    rid: str = ""
    abort_all: bool = False
    message: str = "aborted by the client"


@dataclass
class FlushCacheReq:
    pass


@dataclass
class FlushCacheOut:
    success: bool
    message: str = ""


@dataclass
class GetInternalStateReq:
    pass


@dataclass
class GetInternalStateOut:
    state: dict[str, Any]


@dataclass
class SchedulerReadyOut:
    """Sent once by a scheduler after the model is loaded (through the launcher's pipe)."""

    max_total_num_tokens: int
    max_req_input_len: int
    context_length: int
    vocab_size: int
    num_threads: int
    startup_seconds: float
    dtype: str


@dataclass
class RequestMeta:
    """Per-request counters that travel with every output."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    jump_forward_tokens: int = 0
    retractions: int = 0


@dataclass
class BatchTokenIDOut:
    """Scheduler -> Detokenizer: new token ids per request since the last send."""

    rids: list[str]
    rollbacks: list[int]  # previously sent tokens to drop before appending new_token_ids
    new_token_ids: list[list[int]]
    finished_reasons: list[FinishReason | None]
    metas: list[RequestMeta]
    skip_special_tokens: list[bool]
    spaces_between_special_tokens: list[bool]
    stop_strings: list[list[str]]
    no_stop_trim: list[bool]
    # logprobs (delta for output; input ones are sent once, with the first output)
    output_token_logprobs: list[LogprobList | None] = field(default_factory=list)
    output_top_logprobs: list[list[LogprobList] | None] = field(default_factory=list)
    input_token_logprobs: list[LogprobList | None] = field(default_factory=list)
    input_top_logprobs: list[list[LogprobList | None] | None] = field(default_factory=list)


@dataclass
class BatchStrOut:
    """Detokenizer -> TokenizerManager: new text per request since the last send."""

    rids: list[str]
    delta_texts: list[str]
    new_token_ids: list[list[int]]
    finished_reasons: list[FinishReason | None]
    metas: list[RequestMeta]
    output_token_logprobs: list[LogprobList | None] = field(default_factory=list)
    output_top_logprobs: list[list[LogprobList] | None] = field(default_factory=list)
    input_token_logprobs: list[LogprobList | None] = field(default_factory=list)
    input_top_logprobs: list[list[LogprobList | None] | None] = field(default_factory=list)
