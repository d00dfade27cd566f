"""Pieces shared by the OpenAI completions and chat handlers: sampling params, usage, errors.

Both handlers turn a validated request into one `GenerateReqInput` and read SGLang-shaped dicts
back from the TokenizerManager; these helpers do the mapping both ways.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol, TypedDict, TypeVar, cast

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.generate_output import GenerateOutput, LogprobEntry, MetaInfo
from radixgen.io_struct import GenerateReqInput
from radixgen.json_types import JSONObject, JSONValue
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    parse_request,
)
from radixgen.runtime.entrypoints.openai.responses_store import ResponseStore
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager
from radixgen.server_args import ServerArgs

# (status code, the JSON body the route answers): what a request run without HTTP returns
Answer = tuple[int, Mapping[str, object]]
# a response body built for orjson (its values typed where they are built)
ResponseBody = dict[str, object]


class ServingState(Protocol):
    """What a request run without HTTP needs of its server (ServerState, or the offline batch
    runner's OfflineState over an Engine)."""

    args: ServerArgs
    responses: ResponseStore

    def manager(self, while_draining: bool = False) -> TokenizerManager: ...


class GenerationPlan(Protocol):
    """A validated request turned into the engine's input (ChatPlan, CompletionPlan)."""

    def generate_input(self) -> GenerateReqInput: ...


_Req = TypeVar("_Req", CompletionRequest, ChatCompletionRequest)
_Plan = TypeVar("_Plan", bound=GenerationPlan)

# SGLang sampling-param names -> the OpenAI field a user wrote, for error messages
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "seed": "seed"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest, max_new_tokens: int | None
) -> dict[str, object]:
    """OpenAI fields + SGLang extras -> SGLang `sampling_params` (None means "the default")."""
    sp: dict[str, object] = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": req.min_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "no_stop_trim": req.no_stop_trim,
        "n": req.n,
        "seed": req.seed,
        "logit_bias": req.logit_bias,
        "regex": req.regex,
        "ebnf": req.ebnf,
        "json_schema": req.json_schema,
        "stop_regex": req.stop_regex,
    }
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if req.regex or req.ebnf or req.json_schema:
            raise InvalidRequestError(
                "give either response_format or regex / ebnf / json_schema, not both",
                "response_format",
            )
        if fmt.type == "json_object":
            sp["json_object"] = True
        else:
            spec = fmt.json_schema
            if spec is None or spec.schema_ is None:
                raise InvalidRequestError(
                    "response_format json_schema needs json_schema.schema",
                    "response_format.json_schema",
                )
            sp["json_schema"] = spec.schema_
    return {k: v for k, v in sp.items() if v is not None}


def openai_error(e: InvalidRequestError, prompt_field: str) -> InvalidRequestError:
    """Rename SGLang's parameter names in an error to the OpenAI names the user sent.

    `prompt_field` is what the prompt is called on this endpoint ("messages" or "prompt").
    """
    param = e.param
    names = {**_OPENAI_NAMES, "input_ids": prompt_field, "text": prompt_field}
    if param in names:
        msg = e.message.replace(param, names[param]) if param in _OPENAI_NAMES else e.message
        return type(e)(msg, names[param])
    return e


def finish_reason(meta: MetaInfo) -> tuple[str | None, int | str | None]:
    """SGLang's finish dict -> OpenAI's finish_reason string and SGLang's `matched_stop`."""
    fr = meta.get("finish_reason")
    if not fr:
        return None, None
    kind = fr.get("type")
    if kind == "stop":
        return "stop", fr.get("matched")
    if kind == "length":
        return "length", None
    return "abort", None


def usage(results: list[GenerateOutput], n: int, cache_report: bool) -> JSONObject:
    """Prompt tokens count once per prompt (not per sample); completions add up."""
    prompt = sum(r["meta_info"]["prompt_tokens"] for r in results[::n])
    cached = sum(r["meta_info"].get("cached_tokens", 0) for r in results[::n])
    completion = sum(r["meta_info"]["completion_tokens"] for r in results)
    out: JSONObject = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cache_report:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def continuous_usage(options: StreamOptions | None) -> bool:
    """`stream_options.continuous_usage_stats` (SGLang's and vLLM's extension): every streamed
    chunk carries its choice's usage so far, not only the final usage chunk."""
    return bool(options and options.continuous_usage_stats)


def choice_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """One choice's usage so far, for a chunk under `continuous_usage_stats`."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk_usage(
    prompt_tokens: dict[int, int], completion: dict[int, int], cached: dict[int, int], n: int,
    cache_report: bool,
) -> JSONObject:  # fmt: skip
    """Usage for the final streamed chunk from per-index counters."""
    prompt = sum(v for i, v in prompt_tokens.items() if i % n == 0)
    comp = sum(completion.values())
    out: JSONObject = {
        "prompt_tokens": prompt,
        "completion_tokens": comp,
        "total_tokens": prompt + comp,
    }
    if cache_report:
        out["prompt_tokens_details"] = {
            "cached_tokens": sum(v for i, v in cached.items() if i % n == 0)
        }
    return out


def token_logprob(entry: LogprobEntry, token_bytes: list[bytes]) -> JSONObject:
    """One `[logprob, id, text]` entry -> OpenAI chat's {token, logprob, bytes}.

    `bytes` are the token's raw bytes, so a character split over several tokens (an emoji)
    can be put back together by the client even though each token's text alone is not valid.
    """
    lp, tid, text = _entry(entry)
    text = text or ""
    raw = token_bytes[tid] if 0 <= tid < len(token_bytes) else b""
    return {
        "token": text,
        "logprob": -9999.0 if lp is None else lp,
        "bytes": list(raw or text.encode("utf-8")),
    }


def _entry(entry: LogprobEntry) -> tuple[float | None, int, str | None]:
    """A `[logprob, token id, text]` entry's parts by their types (req_state._lp_entries)."""
    lp, tid, text = entry
    return cast(float | None, lp), cast(int, tid), cast(str | None, text)


def chat_logprobs(
    tokens: list[LogprobEntry],
    tops: Sequence[list[LogprobEntry] | None] | None,
    top_n: int,
    token_bytes: list[bytes],
) -> list[JSONValue]:
    out: list[JSONValue] = []
    for i, entry in enumerate(tokens):
        item = token_logprob(entry, token_bytes)
        row = (tops[i] if tops is not None and i < len(tops) else None) or []
        item["top_logprobs"] = [token_logprob(t, token_bytes) for t in row[:top_n]]
        out.append(item)
    return out


class CompletionLogprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float | None] | None] | None
    text_offset: list[int]


def completion_logprobs(
    tokens: list[LogprobEntry],
    tops: Sequence[list[LogprobEntry] | None] | None,
    offset0: int,
) -> CompletionLogprobs:
    """The legacy completions logprobs object: tokens, token_logprobs, top_logprobs, text_offset."""
    text_tokens: list[str] = []
    lps: list[float | None] = []
    top_rows: list[dict[str, float | None] | None] = []
    offsets: list[int] = []
    pos = offset0
    for i, entry in enumerate(tokens):
        lp, _tid, text = _entry(entry)
        text = text or ""
        text_tokens.append(text)
        lps.append(lp)
        offsets.append(pos)
        pos += len(text)
        row = tops[i] if tops is not None and i < len(tops) else None
        top_rows.append(None if row is None else {(_entry(t)[2] or ""): _entry(t)[0] for t in row})
    return {
        "tokens": text_tokens,
        "token_logprobs": lps,
        "top_logprobs": top_rows if tops is not None else None,
        "text_offset": offsets,
    }


# a streamed request's chunks after the first (http_utils.first_chunk_or_refusal)
Chunks = AsyncGenerator[GenerateOutput, None]


async def serve_generation(
    request: Request,
    request_model: type[_Req],
    make_plan: Callable[[_Req, TokenizerManager], _Plan],
    build_response: Callable[[_Plan, list[GenerateOutput], TokenizerManager, bool], ResponseBody],
    build_stream: Callable[[_Plan, GenerateOutput, Chunks, str, bool], AsyncIterator[bytes]],
    input_field: str,
) -> Response:
    """The request flow both OpenAI generation endpoints share: validate, plan, generate, then
    one JSON response or an SSE stream. Refusals before the first chunk are HTTP errors (an
    invalid input names `input_field`, OpenAI's `param`); a client that left gets 499."""
    state: ServingState = request.app.state.server
    try:
        tm = state.manager()
        tm.check_generates()  # before a chat template is looked for
        req = await hu.read_parsed(request, lambda body: parse_request(request_model, body))
        # NOTE: chat-template rendering and tokenizing are CPU work: a worker thread runs them
        plan = await asyncio.to_thread(make_plan, req, tm)
        obj = plan.generate_input()
        cache_report = state.args.http.enable_cache_report
        if not req.stream:
            result = await hu.until_disconnect(request, hu.collect(tm.generate(obj)))
            results = result if isinstance(result, list) else [result]
            hu.raise_if_failed(results)
            return hu.json_response(build_response(plan, results, tm, cache_report))
        first, rest = await hu.first_chunk_or_refusal(tm.generate(obj), request)
    except hu.ClientDisconnected:
        return Response(status_code=499)
    except InvalidRequestError as e:
        return hu.error_response(openai_error(e, input_field))
    except RadixGenError as e:
        return hu.error_response(e)
    stream = build_stream(plan, first, rest, tm.served_model_name, cache_report)
    return StreamingResponse(stream, media_type="text/event-stream", headers=hu.SSE_HEADERS)


async def generate_json(
    state: ServingState,
    request_model: type[_Req],
    make_plan: Callable[[_Req, TokenizerManager], _Plan],
    build_response: Callable[[_Plan, list[GenerateOutput], TokenizerManager, bool], ResponseBody],
    input_field: str,
    body: JSONObject,
) -> Answer:
    """One non-streaming request from a parsed body, answered as its route would answer it:
    (status code, body). For work that has no HTTP request of its own (a batch line), so it is
    sent as background work: the scheduler queues it below every interactive request."""
    try:
        tm = state.manager()
        req = parse_request(request_model, body)
        plan = await asyncio.to_thread(make_plan, req, tm)
        obj = plan.generate_input()
        obj.background = True
        result = await hu.collect(tm.generate(obj))
        results = result if isinstance(result, list) else [result]
        hu.raise_if_failed(results)
        return 200, build_response(plan, results, tm, state.args.http.enable_cache_report)
    except InvalidRequestError as e:
        failure = hu.error_body(openai_error(e, input_field))
    except RadixGenError as e:
        failure = hu.error_body(e)
    return failure["error"]["code"], failure
