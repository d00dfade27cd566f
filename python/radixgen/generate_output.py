"""SGLang's response dict: what /generate answers and `Engine.generate` returns (no torch).

Built in the API process from a request's state (runtime/request_side/req_state.py `build_output`) and
read by the OpenAI routes; a plain dict at run time, typed here for the code that reads it.
"""

from __future__ import annotations

from typing import TypedDict

from radixgen.finish_reason import FinishReasonDict

LogprobEntry = list[float | int | str | None]
"""One `*_token_logprobs` entry of meta_info: [logprob, token id, token text or None]."""


class _MetaInfoRequired(TypedDict):
    id: str
    finish_reason: FinishReasonDict | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    jump_forward_tokens: int


class MetaInfo(_MetaInfoRequired, total=False):
    """A response's `meta_info` (SGLang's keys); the optional ones are there when they apply."""

    cached_tokens_details: dict[str, int]  # HiCache on: {"device", "host", "storage"}
    grammar_backend: str
    schema_rewrites: list[str]
    schema_checks: list[str]
    schema_check_rollbacks: int
    e2e_latency: float  # once finished
    input_token_logprobs: list[LogprobEntry]  # return_logprob: these five
    output_token_logprobs: list[LogprobEntry]
    output_token_logprobs_length: int
    input_top_logprobs: list[list[LogprobEntry] | None]
    output_top_logprobs: list[list[LogprobEntry]]


class _GenerateOutputRequired(TypedDict):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class GenerateOutput(_GenerateOutputRequired, total=False):
    """One prompt's answer (or streamed chunk): SGLang's `{"text", "output_ids", "meta_info"}`."""

    index: int  # a streamed batch's chunk: which prompt it belongs to
