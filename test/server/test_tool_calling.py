"""Tool calling and reasoning like SGLang, through the official `openai` client against real
servers started with `--tool-call-parser` / `--reasoning-parser`.

The model is tiny, so replies are steered into shape (a forced call's grammar, or a regex), and
the assertions are about what the server makes of them: parsed calls, streamed deltas,
parallel_tool_calls, reasoning_content.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from .conftest import needs_grammar
from .server_process import ServerProcess, running_server, server_flags

pytestmark = [needs_grammar, pytest.mark.slow]  # starts servers of its own

MODEL = "SmolLM2-135M-Instruct"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,  # the openai client's stream helper parses only strict tools
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Rome?"}]
# two mistral-format calls, whatever the model would rather say
TWO_CALLS = (
    r'\[TOOL_CALLS\] \[\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", '
    r'"unit": "celsius"\}\}, \{"name": "get_weather", "arguments": \{"city": "Oslo", '
    r'"unit": "celsius"\}\}\]'
)
THINK = r"<think>[a-z]{2,8}( [a-z]{2,8}){1,3}</think>[A-Z][a-z]{1,8}"


def _client(proc: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def mistral_server() -> Iterator[ServerProcess]:
    with running_server(
        "--tool-call-parser", "mistral", "--reasoning-parser", "qwen3", *server_flags()
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def mistral_oai(mistral_server) -> openai.OpenAI:
    return _client(mistral_server)


def _check_call(call, name="get_weather") -> dict:
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == name
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome", "Oslo") and args["unit"] in ("celsius", "fahrenheit")
    return args


def test_forced_named_call_streams_name_first_then_argument_fragments(mistral_oai):
    plain = mistral_oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=NAMED, max_tokens=60,
        temperature=0,
    )  # fmt: skip
    assert plain.choices[0].finish_reason == "tool_calls"
    assert plain.choices[0].message.content is None
    (plain_call,) = plain.choices[0].message.tool_calls
    expected = _check_call(plain_call)

    entries = []
    with mistral_oai.chat.completions.stream(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=NAMED, max_tokens=60,
        temperature=0,
    ) as stream:  # fmt: skip
        for event in stream:
            if event.type == "chunk" and event.chunk.choices:
                entries += event.chunk.choices[0].delta.tool_calls or []
        final = stream.get_final_completion()
    first, *fragments = entries
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert first.id.startswith("call_") and first.index == 0
    assert len(fragments) >= 2 and all(f.function.name is None for f in fragments)
    assert "".join(f.function.arguments for f in fragments) == plain_call.function.arguments
    (call,) = final.choices[0].message.tool_calls
    assert _check_call(call) == expected and call.id == first.id
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls(mistral_oai, parallel, stream):
    """The reply holds two calls; parallel_tool_calls=false keeps only the first."""
    kwargs = dict(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], max_tokens=90, temperature=0,
        parallel_tool_calls=parallel, extra_body={"regex": TWO_CALLS},
    )  # fmt: skip
    if stream:
        with mistral_oai.chat.completions.stream(**kwargs) as s:
            choice = s.get_final_completion().choices[0]
    else:
        choice = mistral_oai.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls"
    cities = [_check_call(c)["city"] for c in choice.message.tool_calls]
    assert cities[1:] == (["Oslo"] if parallel else [])
    assert len({c.id for c in choice.message.tool_calls}) == len(cities)


def test_reasoning_content_plain_and_streamed(mistral_oai):
    kwargs = dict(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                  extra_body={"regex": THINK})  # fmt: skip
    msg = mistral_oai.chat.completions.create(**kwargs).choices[0].message
    reasoning, content = msg.reasoning_content, msg.content
    assert reasoning and "think>" not in reasoning and " " in reasoning
    assert content[:1].isupper() and content.isalpha()

    kinds, streamed = [], {"reasoning_content": "", "content": ""}
    for chunk in mistral_oai.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta.model_dump() if chunk.choices else {}
        for key in streamed:
            if delta.get(key):
                streamed[key] += delta[key]
                kinds.append(key)
    assert streamed == {"reasoning_content": reasoning, "content": content}
    assert kinds.index("content") > len(kinds) - 1 - kinds[::-1].index("reasoning_content")
    assert kinds.count("reasoning_content") >= 2  # streamed as generated


def test_reasoning_options(mistral_oai):
    def ask(stream: bool = False, **extra):
        kwargs = dict(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                      extra_body={"regex": THINK, **extra})  # fmt: skip
        if not stream:
            return mistral_oai.chat.completions.create(**kwargs).choices[0].message
        return [
            c.choices[0].delta
            for c in mistral_oai.chat.completions.create(**kwargs, stream=True)
            if c.choices
        ]

    whole = ask(separate_reasoning=False)
    assert whole.reasoning_content is None and whole.content.startswith("<think>")
    off = ask(chat_template_kwargs={"enable_thinking": False})
    assert off.reasoning_content is None and "</think>" in off.content
    deltas = ask(stream=True, stream_reasoning=False)
    reasoning = [d.model_dump().get("reasoning_content") for d in deltas]
    assert len([r for r in reasoning if r]) == 1  # sent whole once its end tag is out
    assert ask().reasoning_content == next(r for r in reasoning if r)


@pytest.fixture(scope="module")
def pythonic_oai() -> Iterator[openai.OpenAI]:
    with running_server(
        "--tool-call-parser", "pythonic", "--reasoning-parser", "deepseek-r1", *server_flags()
    ) as proc:
        yield _client(proc)


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_pythonic_forced_call_always_parses(pythonic_oai, choice):
    """The pythonic grammar forces `[get_weather(city=..., unit=...)]`; a forced call is no
    reasoning, even under deepseek-r1 (whose replies otherwise start inside the reasoning)."""
    r = pythonic_oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=40,
        temperature=0,
    )  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.reasoning_content is None
    _check_call(c.message.tool_calls[0])
    with pythonic_oai.chat.completions.stream(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=40,
        temperature=0,
    ) as stream:  # fmt: skip
        final = stream.get_final_completion().choices[0]
    assert (
        final.message.tool_calls[0].function.arguments == c.message.tool_calls[0].function.arguments
    )


def test_deepseek_r1_reply_starts_in_reasoning(pythonic_oai):
    msg = pythonic_oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, temperature=0,
        extra_body={"regex": r"[a-z]{2,8}( [a-z]{2,8}){1,3}</think>[A-Z][a-z]{1,8}"},
    ).choices[0].message  # fmt: skip
    assert msg.reasoning_content and "think" not in msg.reasoning_content
    assert msg.content[:1].isupper() and msg.content.isalpha()


def test_sglang_parse_routes(mistral_server):
    """/parse_function_call and /separate_reasoning answer as SGLang's do."""
    url = mistral_server.url
    text = 'Hi [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}]'
    r = httpx.post(url + "/parse_function_call", json={"text": text, "tools": [WEATHER_TOOL]})
    assert r.status_code == 200 and r.json() == {"normal_text": "Hi", "calls": [
        {"tool_index": 0, "name": "get_weather", "parameters": '{"city": "Rome", "unit": "celsius"}'}]}  # fmt: skip
    r = httpx.post(url + "/parse_function_call", json={
        "text": "[get_weather(city='Oslo', unit='celsius')]", "tools": [WEATHER_TOOL],
        "tool_call_parser": "pythonic"})  # fmt: skip
    assert json.loads(r.json()["calls"][0]["parameters"]) == {"city": "Oslo", "unit": "celsius"}
    r = httpx.post(
        url + "/separate_reasoning",
        json={"text": "hm</think>Yes", "reasoning_parser": "deepseek-r1"},
    )
    assert r.json() == {"reasoning_text": "hm", "text": "Yes"}
    for route, body, param in [
        ("/separate_reasoning", {"text": "x", "reasoning_parser": "nope"}, "reasoning_parser"),
        ("/parse_function_call", {"text": "x", "tool_call_parser": "nope"}, "tool_call_parser"),
        ("/parse_function_call", {"text": "x", "extra": 1}, "extra"),
    ]:
        r = httpx.post(url + route, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def llama3_oai() -> Iterator[openai.OpenAI]:
    with running_server("--tool-call-parser", "llama3", *server_flags()) as proc:
        yield _client(proc)


def test_llama3_json_calls(llama3_oai):
    """A forced call is the bare `{"name", "parameters"}` object; in auto mode such a reply (here
    steered by a regex) is a call, streamed or not."""
    r = llama3_oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=NAMED, max_tokens=60,
        temperature=0,
    )  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls"
    _check_call(r.choices[0].message.tool_calls[0])
    steer = r'\{"name": "get_weather", "parameters": \{"city": "Oslo", "unit": "(celsius|fahrenheit)"\}\}'
    kwargs = dict(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], max_tokens=60, temperature=0,
                  extra_body={"regex": steer})  # fmt: skip
    plain = llama3_oai.chat.completions.create(**kwargs).choices[0]
    assert plain.finish_reason == "tool_calls" and plain.message.content is None
    assert _check_call(plain.message.tool_calls[0])["city"] == "Oslo"
    with llama3_oai.chat.completions.stream(**kwargs) as s:
        streamed = s.get_final_completion().choices[0]
    assert not streamed.message.content  # the role delta opens with content ""
    assert (
        streamed.message.tool_calls[0].function.arguments
        == plain.message.tool_calls[0].function.arguments
    )
