"""POST /v1/completions: prompt text or token ids (single or batch), echo, logprobs, n, streaming.

Choices are ordered prompt-major: choice `i * n + k` is sample k of prompt i, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import Response

from radixgen.errors import InvalidRequestError
from radixgen.generate_output import GenerateOutput, LogprobEntry, MetaInfo
from radixgen.io_struct import GenerateReqInput
from radixgen.json_types import JSONObject
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai import serving_common as common
from radixgen.runtime.entrypoints.openai.protocol import CompletionRequest
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager

DEFAULT_MAX_TOKENS = 16  # OpenAI's default, also for an explicit null


class CompletionPlan:
    def __init__(self, req: CompletionRequest, tm: TokenizerManager) -> None:
        if req.suffix:
            raise InvalidRequestError("suffix (fill-in-the-middle) is not supported", "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise InvalidRequestError("best_of is not supported (only best_of == n)", "best_of")
        self.req = req
        prompt = req.prompt
        if isinstance(prompt, list) and not prompt:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        self.texts: list[str] | None = None
        self.ids: list[list[int]] | None = None
        if isinstance(prompt, str):
            self.texts, self.batch = [prompt], False
        elif isinstance(prompt[0], str):
            self.texts, self.batch = list(prompt), True
        elif isinstance(prompt[0], int):
            self.ids, self.batch = [prompt], False
        else:
            self.ids, self.batch = list(prompt), True
        max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        self.sampling_params = common.sampling_params(req, max_tokens)
        self.tm = tm

    def generate_input(self) -> GenerateReqInput:
        req = self.req
        want_lp = req.logprobs is not None
        text: list[str] | str | None = (
            self.texts if self.batch else (self.texts[0] if self.texts else None)
        )
        ids: list[list[int]] | list[int] | None = (
            self.ids if self.batch else (self.ids[0] if self.ids else None)
        )
        return GenerateReqInput(
            text=text,
            input_ids=ids,
            sampling_params=self.sampling_params,
            return_logprob=want_lp,
            logprob_start_len=0 if (want_lp and req.echo) else None,
            top_logprobs_num=req.logprobs or 0,
            return_text_in_logprobs=True,
            rid=req.rid,
            stream=req.stream,
            data_parallel_rank=req.data_parallel_rank,
            priority=req.priority,
            lora_path=self.tm.adapter_for_model(req.model, req.lora_path),
        )

    def prompt_text(self, choice: int) -> str:
        i = choice // self.req.n
        if self.texts is not None:
            return self.texts[i]
        assert self.ids is not None
        return self.tm.tokenizer.decode(self.ids[i], skip_special_tokens=False)

    def logprobs(
        self, meta: MetaInfo, first_chunk: bool, offset0: int
    ) -> common.CompletionLogprobs:
        """The chunk's logprobs object; `offset0`: the text offset of its first token (where the
        previous chunk's tokens ended), so streamed offsets continue as in one response."""
        tokens = list(meta.get("output_token_logprobs", []))
        tops: Sequence[list[LogprobEntry] | None] | None = (
            meta.get("output_top_logprobs") if self.req.logprobs else None
        )
        if self.req.echo and first_chunk:
            tokens = list(meta.get("input_token_logprobs", [])) + tokens
            if tops is not None:
                tops = list(meta.get("input_top_logprobs", [])) + list(tops)
        return common.completion_logprobs(tokens, tops, offset0)


async def create_completion(request: Request) -> Response:
    return await common.serve_generation(
        request, CompletionRequest, CompletionPlan, _response, _stream, "prompt"
    )


async def run_completion(state: common.ServingState, body: JSONObject) -> common.Answer:
    """One request without HTTP (a batch line): (status code, the route's answer body)."""
    return await common.generate_json(
        state, CompletionRequest, CompletionPlan, _response, "prompt", body
    )


def _response(
    plan: CompletionPlan, results: list[GenerateOutput], tm: TokenizerManager, cache_report: bool
) -> dict[str, object]:
    choices: list[dict[str, object]] = []
    for i, r in enumerate(results):
        meta = r["meta_info"]
        reason, matched = common.finish_reason(meta)
        text = plan.prompt_text(i) + r["text"] if plan.req.echo else r["text"]
        choices.append(
            {
                "index": i,
                "text": text,
                "logprobs": plan.logprobs(meta, True, 0) if plan.req.logprobs is not None else None,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        )
    return {
        "id": common.new_id("cmpl"),
        "object": "text_completion",
        "created": common.now(),
        "model": tm.served_model_name,
        "choices": choices,
        "usage": common.usage(results, plan.req.n, cache_report),
        "system_fingerprint": None,
    }


async def _stream(
    plan: CompletionPlan,
    first: GenerateOutput,
    rest: common.Chunks,
    model: str,
    cache_report: bool,
) -> AsyncIterator[bytes]:
    req = plan.req
    rid, created = common.new_id("cmpl"), common.now()
    sent: dict[int, int] = {}
    lp_end: dict[int, int] = {}  # text offset where each choice's streamed tokens end
    prompt: dict[int, int] = {}
    completion: dict[int, int] = {}
    cached: dict[int, int] = {}
    continuous = common.continuous_usage(req.stream_options)

    def event(i: int, choice: dict[str, object]) -> bytes:
        body: dict[str, object] = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if continuous:
            body["usage"] = common.choice_usage(prompt[i], completion[i])
        return hu.sse_event(body)

    try:
        chunk = first
        while True:
            err = hu.stream_error(chunk)
            if err is not None:
                yield hu.sse_event(err)
                break
            i = chunk.get("index", 0)
            meta, text = chunk["meta_info"], chunk["text"]
            first_for_choice = i not in sent
            delta = text[sent.get(i, 0) :]
            sent[i] = len(text)
            if first_for_choice and req.echo:
                delta = plan.prompt_text(i) + delta
            prompt[i], completion[i] = meta["prompt_tokens"], meta["completion_tokens"]
            cached[i] = meta.get("cached_tokens", 0)
            reason, matched = common.finish_reason(meta)
            lp = None
            if req.logprobs is not None:
                lp = plan.logprobs(meta, first_for_choice, lp_end.get(i, 0))
                if lp["tokens"]:
                    lp_end[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            if delta or reason is not None or (lp and lp["tokens"]):
                yield event(
                    i, {"index": i, "text": delta, "logprobs": lp, "finish_reason": reason,
                     "matched_stop": matched}
                )  # fmt: skip
            try:
                chunk = await rest.__anext__()
            except StopAsyncIteration:
                break
        if req.stream_options and req.stream_options.include_usage and sent:
            usage = common.chunk_usage(prompt, completion, cached, req.n, cache_report)
            yield hu.sse_event(
                {"id": rid, "object": "text_completion", "created": created, "model": model,
                 "choices": [], "usage": usage}
            )  # fmt: skip
    except Exception as e:  # NOTE: a bug too ends the stream with an error event
        yield hu.sse_event(hu.stream_failure(e))
    finally:
        await rest.aclose()
    yield hu.SSE_DONE
