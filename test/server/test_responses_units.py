"""The Responses API's pieces without a server: request checks, input translation to the chat
pipeline, the stored-response LRU, and the stream events checked against the openai SDK's own
event models and its stream accumulator (the spec clients parse)."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter

from radixgen.errors import InvalidRequestError
from radixgen.runtime.entrypoints.openai import responses_items as items
from radixgen.runtime.entrypoints.openai import serving_responses as serving
from radixgen.runtime.entrypoints.openai.chat_deltas import ChatDeltaBuilder
from radixgen.runtime.entrypoints.openai.protocol import parse_request
from radixgen.runtime.entrypoints.openai.responses_events import ResponseEvents, sse
from radixgen.runtime.entrypoints.openai.responses_protocol import (
    ResponsesRequest,
    unsupported_fields,
)
from radixgen.runtime.entrypoints.openai.responses_store import (
    ResponseNotFoundError,
    ResponseStore,
)

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
USAGE = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 8,
}
EVENTS = TypeAdapter(ResponseStreamEvent)


def request(**body) -> ResponsesRequest:
    return parse_request(ResponsesRequest, body)


def refusal_param(**body) -> str | None:
    with pytest.raises(InvalidRequestError) as e:
        req = request(**body)
        unsupported_fields(req)
        items.chat_request(req, [])
    return e.value.param


def test_unsupported_and_unknown_fields_are_named():
    assert refusal_param(input="x", background=True) == "background"
    assert refusal_param(input="x", include=["message.output_text.logprobs"]) == "include"
    assert refusal_param(input="x", reasoning={"effort": "high"}) == "reasoning"
    assert refusal_param(input="x", truncation="auto") == "truncation"
    assert refusal_param(input="x", conversation="conv_1") == "conversation"
    assert refusal_param(input="x", tools=[{"type": "web_search"}]) == "tools[0].type"
    assert refusal_param(input="x", tools=[{**TOOL, "defer_loading": True}]) == (
        "tools[0].defer_loading"
    )
    assert refusal_param(input="x", tool_choice={"type": "file_search"}) == "tool_choice"
    assert refusal_param(input="x", frobnicate=1) == "frobnicate"
    assert refusal_param(input=[{"role": "user", "content": [{"type": "input_image"}]}]) == (
        "input[0].content[0].type"
    )
    assert refusal_param(input=[{"type": "item_reference", "id": "x"}]) == "input[0].type"
    assert refusal_param(input=[]) == "input"
    bad_name = {**TOOL, "name": "not a name"}
    assert refusal_param(input="x", tools=[bad_name]) == "tools[0].name"
    # what the SDKs send by default is accepted
    unsupported_fields(request(input="x", background=False, include=[], truncation="disabled"))


def test_input_items_become_chat_messages():
    req = request(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ],
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=7,
        temperature=0,
        priority=3,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
    )  # fmt: skip
    chat = items.chat_request(req, [{"role": "user", "content": "earlier"}])
    assert chat.priority == 3  # SGLang's priority reaches the scheduler as on chat requests
    assert items.chat_request(request(input="Hi"), []).priority is None
    got = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in got] == ["system", "user", "user", "assistant", "tool", "user"]
    assert got[0]["content"] == "Be brief." and got[1]["content"] == "earlier"
    # the call joins the assistant text before it; reasoning is dropped
    assert got[3]["content"] == "Let me check."
    assert got[3]["tool_calls"][0]["id"] == "c1"
    assert got[3]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert got[4] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert chat.tools[0].function.name == "get_weather" and chat.tools[0].function.strict
    assert chat.tool_choice.function.name == "get_weather"
    assert chat.max_tokens == 7 and chat.temperature == 0
    assert chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema.schema_ == {"type": "object"}


def test_output_items_round_trip_into_the_next_turn():
    message = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        ],
    }  # fmt: skip
    out = items.output_items(message, "completed")
    assert [i["type"] for i in out] == ["message", "function_call"]
    body = items.response_object("resp_1", 0, request(input="x"), "m", out, "completed", USAGE)
    parsed = Response.model_validate(body)
    assert parsed.output_text == "Checking."
    assert parsed.output[1].call_id == "call_1"
    assert parsed.usage.input_tokens_details.cached_tokens == 2
    # the items a client sends back give the assistant turn it came from
    again = items.input_messages(out)
    assert again == [{**message, "content": "Checking."}]
    # a bare reply (no calls) is one message, even when empty
    assert [i["type"] for i in items.output_items({"content": None}, "incomplete")] == ["message"]


def test_input_item_records_are_the_sdks_items():
    given = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ]
    records = items.input_item_records(given)
    parsed = [TypeAdapter(ResponseItem).validate_python(r) for r in records]
    assert [p.type for p in parsed] == [g.get("type", "message") for g in given]
    assert parsed[0].content[0].text == "Be brief." and parsed[1].content[0].text == "Checking."
    assert parsed[2].id == "fc_1" and all(p.id for p in parsed)
    assert items.input_item_records("hi")[0]["content"] == [{"type": "input_text", "text": "hi"}]


def test_store_is_a_bounded_lru():
    store = ResponseStore(capacity=2)
    for n in range(3):
        store.put({"id": f"r{n}"}, [{"role": "user", "content": str(n)}])
        if n == 1:
            store.get("r0")  # used: r1 is now the oldest
    assert len(store) == 2
    assert store.get("r0").conversation == [{"role": "user", "content": "0"}]
    with pytest.raises(ResponseNotFoundError) as e:
        store.get("r1", "previous_response_id")
    assert e.value.status_code == 404 and e.value.param == "previous_response_id"
    store.delete("r2")
    with pytest.raises(ResponseNotFoundError):
        store.delete("r2")


def _replay(events: list[dict]) -> Response:
    """The final response as the SDK's `responses.stream()` helper accumulates it."""
    state = ResponseStreamState(input_tools=[TOOL], text_format=omit)
    for n, event in enumerate(events):
        assert event["sequence_number"] == n
        state.handle_event(EVENTS.validate_python(event))
    final = state._completed_response  # what the helper's get_final_response() returns
    assert final is not None
    return final


def test_stream_events_of_text_then_a_call_in_openai_order():
    req = request(input="x", tools=[TOOL])
    events = ResponseEvents(items.response_object("resp_1", 0, req, "m", [], "in_progress"))
    seq = events.start()
    seq += events.update({"content": "Let me "})
    seq += events.update({"content": "check."})
    seq += events.update(
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]}
    )  # fmt: skip
    seq += events.update({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]})
    seq += events.update({"tool_calls": [{"index": 0, "function": {"arguments": ':"Paris"}'}}]})
    seq += events.finish("completed", USAGE)
    assert [e["type"] for e in seq] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    # events already built do not change when later deltas arrive
    assert seq[2]["item"]["content"] == [] and seq[9]["item"]["arguments"] == ""
    assert seq[6]["text"] == "Let me check."
    assert json.loads(seq[12]["arguments"]) == {"city": "Paris"}
    final = _replay(seq)
    assert final.output_text == "Let me check."
    assert final.output[1].parsed_arguments == {"city": "Paris"}
    assert final.usage.total_tokens == 8
    assert sse(seq[0]).startswith(b"event: response.created\ndata: {")


def test_stream_events_of_a_cut_reply_and_a_failure():
    req = request(input="x")
    events = ResponseEvents(items.response_object("resp_1", 0, req, "m", [], "in_progress"))
    seq = events.start() + events.update({"reasoning_content": "hmm"})
    seq += events.update({"content": "Hel"})
    seq += events.finish("incomplete", USAGE, {"reason": "max_output_tokens"})
    types = [e["type"] for e in seq]
    assert types[2:6] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ]
    assert types[-1] == "response.incomplete"
    last = EVENTS.validate_python(seq[-1])
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output[0].type == "reasoning" and last.response.output_text == "Hel"
    assert last.response.output[1].status == "incomplete"
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in seq:
        state.handle_event(EVENTS.validate_python(event))
    # NOTE: a client behaviour no server can change: the SDK's `responses.stream()` helper keeps
    # only `response.completed`, so its get_final_response() raises for a reply that
    # max_output_tokens cut (OpenAI's own server ends those with `response.incomplete` too)
    assert state._completed_response is None

    events = ResponseEvents(items.response_object("resp_2", 0, req, "m", [], "in_progress"))
    seq = events.start() + events.finish("completed", USAGE)  # nothing said: one empty message
    assert _replay(seq).output_text == ""
    events = ResponseEvents(items.response_object("resp_3", 0, req, "m", [], "in_progress"))
    seq = events.start() + events.update({"content": "a"}) + events.fail("boom")
    assert [e["type"] for e in seq][-2:] == ["response.output_item.done", "response.failed"]
    assert seq[-1]["response"]["error"]["message"] == "boom"
    for event in seq:
        EVENTS.validate_python(event)


class _TextPlan:
    """The part of `ChatPlan` the stream reads, for a plain-text reply."""

    def delta_builder(self) -> ChatDeltaBuilder:
        return ChatDeltaBuilder(None, True, None)


def _chunk(text: str, finish: dict | None = None) -> dict:
    meta = {"prompt_tokens": 4, "completion_tokens": len(text), "cached_tokens": 1}
    return {"text": text, "meta_info": {**meta, "finish_reason": finish}}


def _run_stream(chunks: list[dict], store: ResponseStore) -> list[dict]:
    """The SSE events `_stream` writes for these TokenizerManager chunks."""

    async def rest():
        for chunk in chunks[1:]:
            yield chunk

    async def collect() -> list[bytes]:
        turn = serving._Turn(request(input="Hi"), _TextPlan(), [], "m")
        return [b async for b in serving._stream(turn, chunks[0], rest(), None, store)]

    out = []
    for raw in asyncio.run(collect()):
        head, data = raw.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        out.append(EVENTS.validate_python(event))
    return out


def test_stream_handler_ends_every_stream_with_one_terminal_event():
    store = ResponseStore()
    done = _run_stream([_chunk("Hel"), _chunk("Hello", {"type": "stop"})], store)
    assert done[-1].type == "response.completed" and done[-1].response.output_text == "Hello"
    assert store.get(done[-1].response.id).response["usage"]["input_tokens"] == 4
    cut = _run_stream([_chunk("Hel", {"type": "length"})], store)
    assert cut[-1].type == "response.incomplete" and cut[-1].response.output_text == "Hel"
    broken = {"type": "abort", "status_code": 500, "message": "boom"}
    failed = _run_stream([_chunk("Hel"), _chunk("Hel", broken)], store)
    assert [e.type for e in failed][-5:] == [
        "error",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    assert failed[-1].response.error.message == "boom"
    unfinished = _run_stream([_chunk("Hel")], store)
    assert unfinished[-1].type == "response.failed"
    assert len(store) == 2  # failed responses are not stored
