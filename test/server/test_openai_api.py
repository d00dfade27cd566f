"""The OpenAI-compatible API through the official `openai` client, against the real server."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pydantic
import pytest

from .conftest import needs_grammar

MODEL = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "Say hello."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_models(oai):
    models = oai.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_chat_basic_and_usage(oai):
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
    # bf16 rows do not depend on the batch or on what was cached: a cache hit gives the same reply
    assert again.choices[0].message.content == choice.message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_roles_and_text_parts(oai):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": "Another?"},
    ]
    r = oai.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=4, temperature=0, seed=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 1},
    )  # fmt: skip
    assert r.usage.completion_tokens >= 1


def test_chat_n_seed_and_logprobs(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=5, temperature=1.0, seed=42, n=2, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    assert [c.index for c in r.choices] == [0, 1]
    for choice in r.choices:
        content = choice.logprobs.content
        assert len(content) == 5 or choice.finish_reason == "stop"
        raw = b"".join(bytes(t.bytes) for t in content)
        assert raw.decode("utf-8", errors="ignore").startswith(choice.message.content[:1])
        assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in content)
        assert all(t.bytes == list(t.token.encode()) for t in content if "\ufffd" not in t.token)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)


def test_chat_stream_with_usage(oai):
    stream = oai.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    whole = oai.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert text == whole.choices[0].message.content


def test_completion_basic_batch_and_n(oai):
    prompts = ["The sky is", "One, two,"]
    r = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=4, n=2, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    single = oai.completions.create(model=MODEL, prompt=prompts[1], max_tokens=4, temperature=0)
    assert r.choices[2].text == r.choices[3].text == single.choices[0].text
    n_prompt = single.usage.prompt_tokens
    assert (
        r.usage.prompt_tokens
        == n_prompt
        + oai.completions.create(model=MODEL, prompt=prompts[0], max_tokens=1).usage.prompt_tokens
    )


def test_completion_token_ids_echo_logprobs(oai, http):
    ids = http.post("/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    r = oai.completions.create(
        model=MODEL, prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=2
    )
    choice = r.choices[0]
    assert choice.text.startswith("Hello world")
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3 and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None and len(lp.top_logprobs[-1]) == 2
    batch = oai.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=2, temperature=0)
    assert batch.choices[0].text == batch.choices[1].text


def test_completion_stream_and_stop(oai):
    chunks = list(
        oai.completions.create(
            model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}, logprobs=1,
        )
    )  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens >= 1
    stop = text.strip()[:2]
    r = oai.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[stop]
    )
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text


def test_stream_continuous_usage_stats(oai):
    """SGLang's `stream_options.continuous_usage_stats`: every chunk carries its choice's usage
    so far, ending at the final usage chunk's counts."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    for create, kwargs in (
        (oai.chat.completions.create, {"messages": USER}),
        (oai.completions.create, {"prompt": "One, two,"}),
    ):
        chunks = list(
            create(
                model=MODEL, max_tokens=4, temperature=0, stream=True, stream_options=options,
                extra_body={"ignore_eos": True}, **kwargs,
            )
        )  # fmt: skip
        final = chunks[-1]
        assert final.choices == [] and final.usage.completion_tokens == 4
        usages = [c.usage for c in chunks[:-1]]
        assert usages and all(u is not None for u in usages), chunks
        counts = [u.completion_tokens for u in usages]
        assert counts == sorted(counts) and counts[-1] == 4
        assert all(u.prompt_tokens == final.usage.prompt_tokens for u in usages)
        assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c: c.chat.completions.create(model=MODEL, messages=USER, max_tokens=-1), "max_tokens"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=USER, extra_body={"foo": 1}), "foo"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=[], max_tokens=1), "messages"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=USER, top_logprobs=2), "top_logprobs"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=USER, temperature=5000), "temperature"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "messages.content"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", suffix="y"), "suffix"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=100000), "max_tokens"),
        (lambda c: c.completions.create(model=MODEL, prompt=[]), "prompt"),
    ],
)  # fmt: skip
def test_errors_are_400_naming_the_field(oai, call, param):
    with pytest.raises(openai.BadRequestError) as info:
        call(oai)
    err = info.value.body
    assert info.value.status_code == 400
    assert err["param"] == param, err
    assert err["message"]


def test_tool_history_and_auto_parse(oai):
    """A conversation holding an earlier call and its result renders and answers."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
        }]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]  # fmt: skip
    r = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=12, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        assert choice.message.tool_calls[0].function.name == "get_weather"


@needs_grammar
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_call_always_parses(oai, choice):
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=60, temperature=0,
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    call = c.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    stream = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=60, temperature=0, stream=True,
    )  # fmt: skip
    deltas = [ch.choices[0].delta for ch in stream if ch.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"


@needs_grammar
def test_json_schema_response_format(oai):
    schema = {  # bounded values, so 40 tokens always finish the object
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": ["Ann", "Bob"]},
            "adult": {"type": "boolean"},
        },
        "required": ["name", "adult"],
        "additionalProperties": False,
    }
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
    )  # fmt: skip
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "adult"} and isinstance(obj["adult"], bool)

    class Person(pydantic.BaseModel):  # the client's own structured-output helper
        name: Literal["Ann", "Bob"]
        adult: bool

    parsed = oai.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=40,
        temperature=0, response_format=Person,
    )  # fmt: skip
    assert isinstance(parsed.choices[0].message.parsed, Person)
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A JSON object please."}], max_tokens=30,
        temperature=0, response_format={"type": "json_object"},
    )  # fmt: skip
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


@needs_grammar
def test_completion_regex_extra(oai):
    r = oai.completions.create(
        model=MODEL, prompt="My phone number is", max_tokens=20, temperature=0,
        extra_body={"regex": r" [0-9]{3}-[0-9]{4}"},
    )  # fmt: skip
    import re

    assert re.fullmatch(r" [0-9]{3}-[0-9]{4}", r.choices[0].text)
