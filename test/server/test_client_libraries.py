"""The client libraries our users call the server through, unchanged, against the shared server:
the openai SDK's helpers, instructor, langchain-openai and LiteLLM (pinned in the test extra).

Each test asserts a validated result (a pydantic model the library built, tool arguments that
validate), not only that no exception was raised. Nested models with an enum make pydantic write
`$defs` / `$ref`, the shape that used to be refused in tool parameters. (The Responses API and the
OpenAI Agents SDK: test_responses_api.py.)
"""

from __future__ import annotations

import enum
import os
from typing import Literal

import pytest
from pydantic import BaseModel

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from GitHub at import

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the weather in Paris, France, in celsius?"}]
SAMPLING = {"temperature": 0, "max_tokens": 80}


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class City(BaseModel):
    name: str
    country: str


class Weather(BaseModel):
    city: City
    unit: Unit


class WeatherLiteral(BaseModel):
    city: City
    unit: Literal["celsius", "fahrenheit"]


def is_paris(w: Weather | WeatherLiteral) -> bool:
    return w.city.name == "Paris" and w.city.country.lower() == "france"


def test_pydantic_writes_defs_for_these_models():
    schema = Weather.model_json_schema()
    assert set(schema["$defs"]) == {"City", "Unit"}


# --- the openai SDK --------------------------------------------------------------------------


def test_openai_parse_with_a_nested_model(oai):
    r = oai.chat.completions.parse(model=MODEL, messages=ASK, response_format=Weather, **SAMPLING)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather) and is_paris(parsed)


@pytest.mark.parametrize("choice", ["named", "required"])
def test_openai_pydantic_function_tool_with_nested_models(oai, choice):
    import openai

    tool_choice = (
        {"type": "function", "function": {"name": "Weather"}} if choice == "named" else "required"
    )
    r = oai.chat.completions.parse(
        model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
        tool_choice=tool_choice, **SAMPLING,
    )  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "Weather"
    assert isinstance(call.function.parsed_arguments, Weather)
    assert is_paris(call.function.parsed_arguments)


def test_openai_auto_tool_choice_accepts_nested_parameters(oai):
    import openai

    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="auto", **SAMPLING,
    )  # fmt: skip
    for call in r.choices[0].message.tool_calls or []:  # the model may answer in words
        Weather.model_validate_json(call.function.arguments)


def test_openai_chat_completions_stream_accumulates_one_call(oai):
    import openai

    with oai.chat.completions.stream(
        model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required", **SAMPLING,
    ) as stream:  # fmt: skip
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    (call,) = final.choices[0].message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "Weather"
    assert isinstance(call.function.parsed_arguments, Weather)


# --- instructor ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_nested_model(oai, mode):
    import instructor

    client = instructor.from_openai(oai, mode=getattr(instructor.Mode, mode))
    got = client.chat.completions.create(
        model=MODEL, messages=ASK, response_model=Weather, max_retries=0, **SAMPLING
    )
    assert isinstance(got, Weather) and is_paris(got)


def test_instructor_partial_streaming(oai):
    """Partial objects grow to the whole one. (instructor validates the last one with
    `strict=True` on a python dict, which no server's JSON can pass for an Enum field: that
    model needs `strict=False`, a Literal field passes as is.)"""
    import instructor

    client = instructor.from_openai(oai, mode=instructor.Mode.TOOLS)
    for model, extra in [(WeatherLiteral, {}), (Weather, {"strict": False})]:
        parts = list(
            client.chat.completions.create_partial(
                model=MODEL, messages=ASK, response_model=model, max_retries=0, **SAMPLING, **extra
            )
        )
        assert len(parts) > 2, "the object streams in parts"
        final = model.model_validate(parts[-1].model_dump())
        assert is_paris(final) and final.unit == "celsius"


# --- langchain-openai ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_model(base_url):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=base_url + "/v1", api_key="unused", model=MODEL, max_retries=0,
                      temperature=0, max_tokens=80)  # fmt: skip


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(chat_model, method):
    got = chat_model.with_structured_output(Weather, method=method).invoke(ASK)
    assert isinstance(got, Weather) and is_paris(got)


def test_langchain_with_structured_output_json_mode(chat_model):
    """json_mode sends no schema (only `json_object`): the prompt names the keys."""
    ask = 'Answer in JSON with the keys "name" and "country": which city is the capital of France?'
    got = chat_model.with_structured_output(City, method="json_mode").invoke(
        [{"role": "user", "content": ask}]
    )
    assert isinstance(got, City) and got.name == "Paris"


def test_langchain_bind_tools_streaming(chat_model):
    chunks = list(chat_model.bind_tools([Weather], tool_choice="Weather").stream(ASK))
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    (call,) = message.tool_calls
    assert call["name"] == "Weather" and call["id"].startswith("call_")
    assert is_paris(Weather.model_validate(call["args"]))


# --- LiteLLM ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm_args(base_url):
    return {"model": f"openai/{MODEL}", "api_base": base_url + "/v1", "api_key": "unused"}


def test_litellm_completion_and_stream_agree(litellm_args):
    import litellm

    ask = [{"role": "user", "content": "What is the capital of France?"}]
    whole = litellm.completion(messages=ask, temperature=0, max_tokens=16, **litellm_args)
    text = whole.choices[0].message.content
    assert "Paris" in text and whole.usage.completion_tokens > 0
    stream = litellm.completion(
        messages=ask, temperature=0, max_tokens=16, stream=True, **litellm_args
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == text


def test_litellm_tools(litellm_args):
    import litellm
    import openai

    r = litellm.completion(
        messages=ASK, tools=[openai.pydantic_function_tool(Weather)], tool_choice="required",
        **SAMPLING, **litellm_args,
    )  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "Weather"
    assert is_paris(Weather.model_validate_json(call.function.arguments))
