"""Request parsing and tool-call parsing as plain functions (no server needed)."""

from __future__ import annotations

import json

import pytest

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.finish_reason import FinishReason
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.generate_request import parse_generate_request
from radixgen.runtime.entrypoints.openai import tool_calls as tc
from radixgen.runtime.entrypoints.openai.chat_deltas import ToolCallStreamer
from radixgen.runtime.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    Tool,
    parse_request,
)
from radixgen.runtime.entrypoints.openai.tool_parsers import create_tool_call_parser

TOOLS = [
    Tool.model_validate({"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}),
    Tool.model_validate({"type": "function", "function": {"name": "now"}}),
]  # fmt: skip


def test_generate_body_batch_and_per_item_fields():
    obj = parse_generate_request(
        {"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": 2}], "rid": ["x", "y"],
         "return_logprob": [True, False], "image_data": None, "lora_path": None, "priority": 3}
    )  # fmt: skip
    assert obj.is_batch and obj.batch_size() == 2
    assert obj.item(1).sampling_params == {"max_new_tokens": 2} and obj.item(1).rid == "y"


def test_generate_body_takes_what_the_sglang_router_forwards():
    """sglang-router 0.3.2 re-serializes /generate with these keys on every request."""
    obj = parse_generate_request(
        {"text": "a", "model": None, "sampling_params": {"max_new_tokens": 2},
         "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
         "return_hidden_states": False, "background": False, "no_logs": False,
         "return_bytes": False, "return_entropy": False}
    )  # fmt: skip
    assert obj.text == "a" and obj.sampling_params == {"max_new_tokens": 2}
    assert parse_generate_request({"text": "a", "model": "any-name"}).text == "a"
    obj = parse_generate_request({"text": ["a", "b"], "data_parallel_rank": 1})
    assert obj.item(1).data_parallel_rank == 1
    assert parse_generate_request({"text": "a", "routed_dp_rank": 0}).data_parallel_rank == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"text": 3}, "text"),
        ({"text": []}, "text"),
        ({"input_ids": [[1], "x"]}, "input_ids"),
        ({"input_ids": [1.5]}, "input_ids"),
        ({"text": "a", "rid": ["x"]}, "rid"),
        ({"text": "a", "stream": "yes"}, "stream"),
        ({"text": "a", "lora_path": 3}, "lora_path"),
        ({"text": ["a", "b"], "lora_path": ["x"]}, "lora_path"),
        ({"text": "a", "whatever": 1}, "whatever"),
        ({"text": "a", "model": 3}, "model"),
        ({"text": "a", "data_parallel_rank": "1"}, "data_parallel_rank"),
        ({"text": "a", "return_entropy": True}, "return_entropy"),
    ],
)
def test_generate_body_errors_name_the_field(body, param):
    with pytest.raises(InvalidRequestError) as info:
        parse_generate_request(body)
    assert info.value.param == param


def test_openai_models_accept_client_fields_and_refuse_unknown():
    req = parse_request(ChatCompletionRequest, {
        "model": "m", "messages": [{"role": "assistant", "content": None, "refusal": None,
                                    "tool_calls": [{"id": "c", "type": "function",
                                                    "function": {"name": "add", "arguments": "{}"}}]}],
        "user": "u", "metadata": {"k": "v"}, "store": False, "parallel_tool_calls": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    })  # fmt: skip
    assert req.response_format.json_schema.schema_ == {"type": "object"}
    with pytest.raises(InvalidRequestError) as info:
        parse_request(CompletionRequest, {"prompt": "x", "n": 0})
    assert info.value.param == "n"
    with pytest.raises(InvalidRequestError) as info:
        parse_request(
            ChatCompletionRequest, {"messages": [{"role": "user", "content": "x", "x": 1}]}
        )
    assert info.value.param == "messages.0.x"
    with pytest.raises(InvalidRequestError) as info:
        parse_request(
            ChatCompletionRequest, {"messages": [{"role": "user"}], "tool_choice": "always"}
        )
    assert info.value.param == "tool_choice"
    # what the SGLang router's dp-aware mode adds to every OpenAI request
    req = parse_request(CompletionRequest, {"prompt": "x", "data_parallel_rank": 1})
    assert req.data_parallel_rank == 1


def test_parse_tool_calls_auto():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>{"name": "now", "arguments": {}}'
    content, calls = tc.parse_tool_calls(text, TOOLS)
    assert content == "Let me add."
    assert [c["function"]["name"] for c in calls] == ["add", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize(
    "text",
    [
        "no call here",
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
        "<tool_call>{broken",
    ],
)
def test_unparsable_calls_stay_text(text):
    assert tc.parse_tool_calls(text, TOOLS) == (text, [])


def test_forced_call_and_schema():
    calls = tc.parse_forced_call(
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', TOOLS
    )
    assert calls[0]["function"]["name"] == "add"
    assert tc.parse_forced_call('{"name": "add", "argu', TOOLS) == []
    schema = tc.call_schema(TOOLS, "required")
    assert [o["properties"]["name"]["enum"] for o in schema["anyOf"]] == [["add"], ["now"]]
    assert tc.call_schema(TOOLS, "now")["properties"]["arguments"] == {"type": "object"}


def test_stream_filter_holds_back_a_possible_tag():
    """Streamed content stops before a possible `<tool_call>` and resumes when it is not one."""
    parser = create_tool_call_parser("qwen25")
    f = ToolCallStreamer(parser, {"add", "now"}, None)
    assert f.update("Hello <tool") == ("Hello", [])
    assert f.update("Hello <tool_call>{") == ("", [])
    g = ToolCallStreamer(parser, {"add", "now"}, None)
    assert g.update("a <to") == ("a", [])
    assert g.update("a <tomato>") == (" <tomato>", [])
    assert g.finish("a <tomato> end") == (" end", [])


def test_tool_mode():
    assert tc.tool_mode(None, None) is None
    assert tc.tool_mode(TOOLS, None) == "auto"
    assert tc.tool_mode(TOOLS, "none") is None
    with pytest.raises(InvalidRequestError):
        tc.tool_mode(None, "required")


@pytest.mark.parametrize(
    ("status", "err_type"),
    [(400, "invalid_request_error"), (500, "internal_error"), (503, "engine_dead")],
)
def test_failed_requests_answer_with_their_status(status, err_type):
    """A request failed in the engine (bad input, a contained bug, a dead child) answers with its
    status: an error JSON when not streamed, an error event when streamed; a client's own abort
    (499) is a normal end."""
    fr = FinishReason.abort(f"failed with {status}", status).to_dict()
    result = {"text": "", "meta_info": {"finish_reason": fr}}
    with pytest.raises(RadixGenError) as info:
        hu.raise_if_failed([result, {"text": "", "meta_info": {"finish_reason": None}}])
    body = hu.error_body(info.value)["error"]
    assert (body["code"], body["type"], body["message"]) == (status, err_type, fr["message"])
    event = hu.stream_error(result)["error"]
    assert (event["code"], event["type"], event["retryable"]) == (status, err_type, status == 503)
    client_abort = {"meta_info": {"finish_reason": FinishReason.abort("bye", 499).to_dict()}}
    hu.raise_if_failed(client_abort)
    assert hu.stream_error(client_abort) is None


def test_a_stream_broken_by_a_bug_ends_with_a_500_event_and_logs_the_traceback(caplog):
    try:
        raise KeyError("lost")
    except KeyError as e:
        body = hu.stream_failure(e)["error"]
    assert (body["code"], body["type"]) == (500, "internal_error") and "lost" in body["message"]
    assert "Traceback" in caplog.text and "KeyError" in caplog.text
    refused = hu.stream_failure(InvalidRequestError("bad", "x"))["error"]
    assert (refused["code"], refused["param"]) == (400, "x")
