"""POST /v1/responses, GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items:
OpenAI's Responses API (API process).

No second generation path: the request becomes a chat request (`responses_items.chat_request`)
served by `serving_chat.ChatPlan` (chat template, tools prompt and forced-call grammar,
`text.format` as `response_format`, tool-call and reasoning parsers), and the reply is reshaped
into output items, or into the Responses stream events (`responses_events.py`). Responses are
stored in memory (`responses_store.py`) unless `store: false`, for GET / DELETE and for a later
turn's `previous_response_id`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.generate_output import GenerateOutput
from radixgen.json_types import JSONObject
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.openai import responses_items as items
from radixgen.runtime.entrypoints.openai import serving_common as common
from radixgen.runtime.entrypoints.openai.protocol import parse_request
from radixgen.runtime.entrypoints.openai.responses_events import ResponseEvents, sse
from radixgen.runtime.entrypoints.openai.responses_protocol import (
    ResponsesRequest,
    unsupported_fields,
)
from radixgen.runtime.entrypoints.openai.responses_store import ResponseStore
from radixgen.runtime.entrypoints.openai.serving_chat import ChatPlan
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager

# the chat pipeline's parameter names -> the Responses request's, for error messages
_PARAM_NAMES = {
    "messages": "input",
    "messages.content": "input",
    "input_ids": "input",
    "text": "input",
    "max_new_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema": "text.format.schema",
}


def _renamed(e: InvalidRequestError) -> InvalidRequestError:
    param = e.param
    if param not in _PARAM_NAMES:
        return e
    msg = e.message
    if param in ("max_new_tokens", "max_tokens"):
        msg = msg.replace(param, "max_output_tokens")
    return type(e)(msg, _PARAM_NAMES[param])


class _Turn:
    """One response being made: the request, its chat plan and what to store when done."""

    def __init__(
        self, req: ResponsesRequest, plan: ChatPlan, history: list[dict[str, Any]], model: str
    ) -> None:
        self.req, self.plan, self.model = req, plan, model
        self.id = items.new_item_id("resp")
        self.created_at = int(time.time())
        # the conversation without instructions, as the next turn will see it
        self.conversation = history + items.input_messages(req.input)

    def skeleton(self) -> dict[str, Any]:
        return items.response_object(
            self.id, self.created_at, self.req, self.model, [], "in_progress"
        )

    def store(self, store: ResponseStore, response: dict[str, Any]) -> None:
        if self.req.store is not False:
            conversation = self.conversation + items.input_messages(response["output"])
            store.put(response, conversation, items.input_item_records(self.req.input))


def _reasoning_tokens(tm: TokenizerManager, output: list[dict[str, Any]]) -> int:
    texts = [c["text"] for it in output if it["type"] == "reasoning" for c in it["content"]]
    return sum(len(tm.tokenizer.encode(t, add_special_tokens=False)) for t in texts)


async def _start_turn(req: ResponsesRequest, tm: TokenizerManager, store: ResponseStore) -> _Turn:
    """Check the request, join the stored conversation it continues and plan the chat."""
    unsupported_fields(req)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        history = store.get(req.previous_response_id, "previous_response_id").conversation
    chat_req = items.chat_request(req, history)
    # NOTE: chat-template rendering and tokenizing are CPU work: a worker thread runs them
    plan = await asyncio.to_thread(ChatPlan, chat_req, tm)
    return _Turn(req, plan, history, tm.served_model_name)


async def run_response(state: common.ServingState, body: JSONObject) -> common.Answer:
    """One non-streaming request without HTTP (a batch line): (status code, answer body)."""
    try:
        tm = state.manager()
        req = parse_request(ResponsesRequest, body)
        turn = await _start_turn(req, tm, state.responses)
        obj = turn.plan.generate_input()
        obj.background = True  # a batch line: below interactive requests in the scheduler
        result = await hu.collect(tm.generate(obj))
        hu.raise_if_failed(result)
        return 200, _finished(turn, hu.single(result), tm, state.responses)
    except InvalidRequestError as e:
        failure = hu.error_body(_renamed(e))
    except RadixGenError as e:
        failure = hu.error_body(e)
    return failure["error"]["code"], failure


async def create_response(request: Request) -> Response:
    state = request.app.state.server
    store: ResponseStore = state.responses
    try:
        tm = state.manager()
        req = await hu.read_parsed(request, lambda body: parse_request(ResponsesRequest, body))
        turn = await _start_turn(req, tm, store)
        obj = turn.plan.generate_input()
        if not req.stream:
            result = await hu.until_disconnect(request, hu.collect(tm.generate(obj)))
            hu.raise_if_failed(result)
            return hu.json_response(_finished(turn, hu.single(result), tm, store))
        first, rest = await hu.first_chunk_or_refusal(tm.generate(obj), request)
    except hu.ClientDisconnected:
        return Response(status_code=499)
    except InvalidRequestError as e:
        return hu.error_response(_renamed(e))
    except RadixGenError as e:
        return hu.error_response(e)
    stream = _stream(turn, first, rest, tm, store)
    return StreamingResponse(stream, media_type="text/event-stream", headers=hu.SSE_HEADERS)


def _finished(
    turn: _Turn, result: GenerateOutput, tm: TokenizerManager, store: ResponseStore
) -> dict[str, Any]:
    meta = result["meta_info"]
    reason, _ = common.finish_reason(meta)
    message, _ = turn.plan.message(result["text"])
    status, incomplete = items.status_of(reason)
    output = items.output_items(message, status)
    usage = items.usage(meta, _reasoning_tokens(tm, output))
    body = items.response_object(
        turn.id, turn.created_at, turn.req, turn.model, output, status, usage, incomplete
    )
    turn.store(store, body)
    return body


async def _stream(
    turn: _Turn,
    first: GenerateOutput,
    rest: common.Chunks,
    tm: TokenizerManager,
    store: ResponseStore,
) -> AsyncIterator[bytes]:
    events = ResponseEvents(turn.skeleton())
    deltas = turn.plan.delta_builder()
    for event in events.start():
        yield sse(event)
    ended = False  # a terminal event was sent (completed, incomplete or failed)
    try:
        chunk = first
        while True:
            err = hu.stream_error(chunk)
            if err is not None:
                ended = True
                for event in events.fail(err["error"]["message"]):
                    yield sse(event)
                break
            meta, text = chunk["meta_info"], chunk["text"]
            reason, _ = common.finish_reason(meta)
            if reason is None:
                for event in events.update(deltas.update(text)):
                    yield sse(event)
            else:
                last, _ = deltas.finish(text)
                done = events.update(last)
                status, incomplete = items.status_of(reason)
                usage = items.usage(meta, _reasoning_tokens(tm, events.output))
                done += events.finish(status, usage, incomplete)
                turn.store(store, events.response)
                ended = True
                for event in done:
                    yield sse(event)
                break
            try:
                chunk = await rest.__anext__()
            except StopAsyncIteration:
                break
        if not ended:
            ended = True
            for event in events.fail("the generation ended without a finish reason"):
                yield sse(event)
    except Exception as e:  # NOTE: a bug too ends the stream with an error event
        if not ended:
            for event in events.fail(hu.stream_failure(e)["error"]["message"]):
                yield sse(event)
    finally:
        await rest.aclose()


async def retrieve_response(response_id: str, request: Request) -> Response:
    store: ResponseStore = request.app.state.server.responses
    try:
        return hu.json_response(store.get(response_id).response)
    except RadixGenError as e:
        return hu.error_response(e)


async def list_input_items(
    response_id: str,
    request: Request,
    after: str | None = None,
    limit: int = 20,
    order: str = "desc",
) -> Response:
    """A stored response's input items, a page at a time (OpenAI's cursor list: newest first
    unless order=asc, `after` an item id)."""
    store: ResponseStore = request.app.state.server.responses
    try:
        if order not in ("asc", "desc"):
            raise InvalidRequestError("order must be 'asc' or 'desc'", "order")
        if not 1 <= limit <= 100:
            raise InvalidRequestError("limit must be between 1 and 100", "limit")
        if request.query_params.getlist("include"):
            raise InvalidRequestError("no extra input item data can be included", "include")
        records = store.get(response_id).input_items
        records = records if order == "asc" else records[::-1]
        if after is not None:
            ids = [r["id"] for r in records]
            if after not in ids:
                raise InvalidRequestError(f"no input item '{after}' in this response", "after")
            records = records[ids.index(after) + 1 :]
    except RadixGenError as e:
        return hu.error_response(e)
    page = records[:limit]
    return hu.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(records) > limit,
        }
    )


async def delete_response(response_id: str, request: Request) -> Response:
    store: ResponseStore = request.app.state.server.responses
    try:
        store.delete(response_id)
    except RadixGenError as e:
        return hu.error_response(e)
    return hu.json_response({"id": response_id, "object": "response", "deleted": True})
