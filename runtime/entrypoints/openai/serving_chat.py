"""POST /v1/chat/completions: messages through the chat template, tools, JSON output, streaming.

The prompt is rendered and tokenized here (without adding special tokens: the template writes
them) and sent as `input_ids`, so its length is known for the default `max_tokens` (the rest of
the context window, as OpenAI does).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from radixgen.errors import InvalidRequestError
from radixgen.generate_output import GenerateOutput
from radixgen.grammar_limits import check_schema_object
from radixgen.io_struct import GenerateReqInput
from radixgen.json_types import JSONObject
from radixgen.reasoning_parser import ReasoningParser
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai import serving_common as common
from radixgen.runtime.entrypoints.openai import tool_calls as tc
from radixgen.runtime.entrypoints.openai.chat_deltas import (
    ChatDelta,
    ChatDeltaBuilder,
    ToolCallStreamer,
    openai_deltas,
)
from radixgen.runtime.entrypoints.openai.protocol import ChatCompletionRequest
from radixgen.runtime.entrypoints.openai.tool_call_grammar import forced_call_constraint
from radixgen.runtime.entrypoints.openai.tool_parsers import ToolCallDict, create_tool_call_parser
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager


class ChatPlan:
    """What one chat request turns into: prompt ids, sampling params and how to read the reply."""

    def __init__(self, req: ChatCompletionRequest, tm: TokenizerManager) -> None:
        self.req = req
        self.lora_path = tm.adapter_for_model(req.model, req.lora_path)
        self.mode = tc.tool_mode(req.tools, req.tool_choice)
        for tool in req.tools or []:  # JSON schemas too: json.dumps below must not overflow
            check_schema_object(tool.function.parameters, tm.grammar_limits, "tools")
        self.forced = self.mode not in (None, "auto")  # constrained to one call's JSON
        tok = tm.tokenizer
        self.token_bytes = tok.token_bytes if req.logprobs else []
        if tok.chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template; start the server with --chat-template",
                "messages",
            )
        native_tools = "tools" in tok.chat_template.source
        parsers = tm.args.parsers
        self.parser = create_tool_call_parser(parsers.tool_call_parser, tok.chat_template.source)
        self.tool_names = {t.function.name for t in req.tools or []}
        self.max_calls = 1 if req.parallel_tool_calls is False else None
        self.reasoning = _reasoning_parser(parsers.reasoning_parser, req, self.forced)
        messages = [_template_message(m.model_dump(exclude_none=True)) for m in req.messages]
        tm.limits.check_prompt_chars(sum(len(m["content"]) for m in messages), "messages")
        tools_arg = None
        if self.mode is not None and native_tools:
            tools_arg = [t.model_dump(exclude_none=True) for t in req.tools or []]
        elif req.tools:
            messages = tc.history_messages(messages, self.parser)
            if self.mode is not None:
                prompt = tc.tools_system_prompt(
                    req.tools, self.mode, self.parser, self.max_calls is None
                )
                messages = _with_system(messages, prompt)
        kwargs = dict(req.chat_template_kwargs or {})
        clash = sorted(set(kwargs) & {"messages", "tools", "add_generation_prompt"})
        if clash:
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(clash)}", "chat_template_kwargs"
            )
        if req.continue_final_message:
            if messages[-1]["role"] != "assistant":
                raise InvalidRequestError(
                    "continue_final_message needs an assistant message last", "messages"
                )
            rendered = tok.render_chat(messages, False, tools_arg, **kwargs)
            last = messages[-1].get("content") or ""
            cut = rendered.text.rfind(last) if last else -1
            if cut != -1:
                rendered = rendered.truncated(cut + len(last))
        else:
            rendered = tok.render_chat(messages, True, tools_arg, **kwargs)
        if self.forced and self.parser.forced_prefix:
            rendered = rendered.with_suffix(self.parser.forced_prefix)
        self.input_ids = tok.encode_chat(rendered, tm.args.model.allow_special_tokens_in_messages)
        limit = tm.max_request_tokens
        max_new = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        if max_new is None:
            max_new = max(0, limit - len(self.input_ids))
        self.sampling_params = common.sampling_params(req, max_new)
        markers = self.parser.markers if self.mode is not None else ()
        if self.reasoning is not None:
            markers += (self.reasoning.format.open_tag, self.reasoning.format.close_tag)
        if any(tok.holds_special_token(m) for m in markers):
            self.sampling_params["skip_special_tokens"] = False  # as SGLang: keep the markers
        if self.forced:
            if {"json_schema", "json_object", "regex", "ebnf"} & set(self.sampling_params):
                raise InvalidRequestError(
                    "a forced tool call cannot be combined with response_format, regex or ebnf",
                    "tool_choice",
                )
            assert self.mode is not None
            constraint = forced_call_constraint(self.parser, req.tools or [], self.mode)
            self.sampling_params.update(constraint)

    def generate_input(self) -> GenerateReqInput:
        req = self.req
        if req.top_logprobs and not req.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
        return GenerateReqInput(
            input_ids=self.input_ids,
            sampling_params=self.sampling_params,
            return_logprob=req.logprobs,
            top_logprobs_num=req.top_logprobs or 0,
            return_text_in_logprobs=True,
            rid=req.rid,
            stream=req.stream,
            data_parallel_rank=req.data_parallel_rank,
            priority=req.priority,
            lora_path=self.lora_path,
        )

    def message(self, text: str) -> tuple[dict[str, object], bool]:
        """The assistant message for a finished reply, and whether it holds tool calls."""
        calls: list[ToolCallDict] = []
        reasoning, answer = None, text
        if self.reasoning is not None:
            reasoning, answer = self.reasoning.parse(text)
        content: str | None = answer
        if self.forced:
            prefixed = self.parser.forced_prefix + text
            _, calls = self.parser.parse(prefixed, self.tool_names, 1)
            content = None if calls else text
        elif self.mode == "auto":
            content, calls = self.parser.parse(answer, self.tool_names, self.max_calls)
        msg: dict[str, object] = {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
        }
        if calls:
            msg["tool_calls"] = calls
        return msg, bool(calls)

    def delta_builder(self) -> ChatDeltaBuilder:
        """Turns one choice's text so far into stream deltas, agreeing with `message`."""
        tools = None
        if self.mode is not None:
            prefix = self.parser.forced_prefix if self.forced else ""
            max_calls = 1 if self.forced else self.max_calls
            tools = ToolCallStreamer(self.parser, self.tool_names, max_calls, prefix)
        return ChatDeltaBuilder(self.reasoning, self.req.stream_reasoning, tools)


def _reasoning_parser(
    name: str | None, req: ChatCompletionRequest, forced_call: bool
) -> ReasoningParser | None:
    """The server's reasoning parser for this request, unless the request opts out
    (separate_reasoning=false), turns thinking off (qwen3 enable_thinking=false), or forces a
    tool call (the reply is the call)."""
    if name is None or not req.separate_reasoning or forced_call:
        return None
    thinking = (req.chat_template_kwargs or {}).get("enable_thinking", True)
    return ReasoningParser(name, enabled=not (name == "qwen3" and thinking is False))


def _template_message(m: Mapping[str, Any]) -> dict[str, Any]:
    """Text parts joined into one string; "developer" is a system message to the template."""
    role = "system" if m["role"] == "developer" else m["role"]
    content = m.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(
                    f"content part {j} has type {part.get('type')!r}; only text parts are supported",
                    "messages.content",
                )
            texts.append(part["text"])
        content = "\n".join(texts)
    out = {
        k: v for k, v in m.items() if k not in ("refusal", "audio", "annotations", "function_call")
    }
    out["role"] = role
    out["content"] = content if content is not None else ""
    return out


def _with_system(messages: list[dict[str, Any]], extra: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{extra}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": extra}, *messages]


async def create_chat_completion(request: Request) -> Response:
    return await common.serve_generation(
        request, ChatCompletionRequest, ChatPlan, _response, _stream, "messages"
    )


async def run_chat_completion(state: common.ServingState, body: JSONObject) -> common.Answer:
    """One request without HTTP (a batch line): (status code, the route's answer body)."""
    return await common.generate_json(
        state, ChatCompletionRequest, ChatPlan, _response, "messages", body
    )


def _response(
    plan: ChatPlan, results: list[GenerateOutput], tm: TokenizerManager, cache_report: bool
) -> dict[str, object]:
    choices: list[dict[str, object]] = []
    for i, r in enumerate(results):
        meta = r["meta_info"]
        reason, matched = common.finish_reason(meta)
        msg, has_calls = plan.message(r["text"])
        logprobs = None
        if plan.req.logprobs:
            logprobs = {
                "content": common.chat_logprobs(
                    meta.get("output_token_logprobs", []),
                    meta.get("output_top_logprobs"),
                    plan.req.top_logprobs or 0,
                    tm.tokenizer.token_bytes,
                ),
                "refusal": None,
            }
        choices.append(
            {
                "index": i,
                "message": msg,
                "logprobs": logprobs,
                "finish_reason": "tool_calls" if has_calls else reason,
                "matched_stop": matched,
            }
        )
    return {
        "id": common.new_id("chatcmpl"),
        "object": "chat.completion",
        "created": common.now(),
        "model": tm.served_model_name,
        "choices": choices,
        "usage": common.usage(results, plan.req.n, cache_report),
        "system_fingerprint": None,
    }


async def _stream(
    plan: ChatPlan, first: GenerateOutput, rest: common.Chunks, model: str, cache_report: bool
) -> AsyncIterator[bytes]:
    req = plan.req
    rid, created = common.new_id("chatcmpl"), common.now()
    sent: dict[int, int] = {}
    builders: dict[int, ChatDeltaBuilder] = {}
    prompt: dict[int, int] = {}
    completion: dict[int, int] = {}
    cached: dict[int, int] = {}
    continuous = common.continuous_usage(req.stream_options)

    def event(index: int, delta: ChatDelta, reason: str | None = None, **extra: object) -> bytes:
        choice: dict[str, object] = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": reason,
            **extra,
        }
        body: dict[str, object] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if continuous:
            body["usage"] = common.choice_usage(prompt[index], completion[index])
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
            prompt[i], completion[i] = meta["prompt_tokens"], meta["completion_tokens"]
            cached[i] = meta.get("cached_tokens", 0)
            if i not in sent:
                sent[i] = 0
                builders[i] = plan.delta_builder()
                yield event(i, {"role": "assistant", "content": ""})
            sent[i] = len(text)
            delta = builders[i].update(text)
            extra: dict[str, object] = {}
            if req.logprobs and meta.get("output_token_logprobs"):
                extra["logprobs"] = {
                    "content": common.chat_logprobs(
                        meta["output_token_logprobs"], meta.get("output_top_logprobs"),
                        req.top_logprobs or 0, plan.token_bytes,
                    ),
                    "refusal": None,
                }  # fmt: skip
            deltas = openai_deltas(delta)
            if extra and not deltas:
                deltas = [{"content": ""}]
            for n, d in enumerate(deltas):
                yield event(i, d, None, **(extra if n == 0 else {}))
            reason, matched = common.finish_reason(meta)
            if reason is not None:
                last, has_calls = builders[i].finish(text)
                for d in openai_deltas(last):
                    yield event(i, d)
                if has_calls:
                    reason = "tool_calls"
                yield event(i, {}, reason, matched_stop=matched)
            try:
                chunk = await rest.__anext__()
            except StopAsyncIteration:
                break
        if req.stream_options and req.stream_options.include_usage and sent:
            usage = common.chunk_usage(prompt, completion, cached, req.n, cache_report)
            yield hu.sse_event(
                {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [], "usage": usage}
            )  # fmt: skip
    except Exception as e:  # NOTE: a bug too ends the stream with an error event
        yield hu.sse_event(hu.stream_failure(e))
    finally:
        await rest.aclose()
    yield hu.SSE_DONE
