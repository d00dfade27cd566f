"""`/v1/responses` through real clients against the shared server: the openai SDK
(`responses.create`, its stream, the `responses.stream` and `responses.parse` helpers) and the
OpenAI Agents SDK (an `Agent` with a function tool, run to completion through
`OpenAIResponsesModel` and `OpenAIChatCompletionsModel`). Each test checks a validated result:
JSON that validates against its schema, tool arguments against the tool's parameters, the cache
hit of a `previous_response_id` turn. Short replies (temperature 0, few tokens): the model is
SmolLM2-135M."""

from __future__ import annotations

import asyncio
import json
import uuid

import jsonschema
import openai
import pydantic
import pytest

from .conftest import needs_grammar

MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the capital of France?"
CITY_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": CITY_PARAMS,
    "strict": True,
}


def test_text_turn_then_a_follow_up_served_from_the_cache(oai):
    instructions = f"You are a helpful assistant ({uuid.uuid4().hex[:8]})."  # fresh prefix
    first = oai.responses.create(
        model=MODEL, input=QUESTION, instructions=instructions, max_output_tokens=12, temperature=0
    )
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.status in ("completed", "incomplete")
    assert first.instructions == instructions and first.temperature == 0
    message = first.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert first.output_text == message.content[0].text and first.output_text.strip()
    usage = first.usage
    assert 0 < usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0

    # the next turn's prompt is the first turn's prompt and reply plus the new input
    follow = oai.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "And of Germany?"}],
        previous_response_id=first.id,
        instructions=instructions,
        max_output_tokens=8,
        temperature=0,
    )
    assert follow.previous_response_id == first.id
    assert follow.usage.input_tokens > first.usage.input_tokens + 3
    cached = follow.usage.input_tokens_details.cached_tokens
    assert cached > first.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens // 2, follow.usage

    stored = oai.responses.retrieve(follow.id)
    assert stored.id == follow.id and stored.output_text == follow.output_text
    (asked,) = oai.responses.input_items.list(follow.id)  # this turn's input only
    assert asked.type == "message" and asked.role == "user"
    assert asked.content[0].text == "And of Germany?"
    oai.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model=MODEL, input="Hi", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"


@needs_grammar
def test_json_schema_text_format_and_the_parse_helper(oai):
    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        age: int = pydantic.Field(ge=0, le=120)

    schema = Person.model_json_schema() | {"additionalProperties": False}
    r = oai.responses.create(
        model=MODEL,
        input="Invent a person. Reply in JSON.",
        text={
            "format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
        },
        max_output_tokens=48,
        temperature=0,
    )
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), schema)

    parsed = oai.responses.parse(
        model=MODEL,
        input="Invent a person.",
        text_format=Person,
        max_output_tokens=48,
        temperature=0,
    )
    assert isinstance(parsed.output_parsed, Person)


@needs_grammar
def test_forced_function_call_then_its_output_continues(oai):
    r = oai.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id
    jsonschema.validate(json.loads(call.arguments), CITY_PARAMS)

    follow = oai.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=12,
        temperature=0,
    )
    assert follow.output[0].type == "message" and follow.output_text.strip()
    assert follow.usage.input_tokens_details.cached_tokens > 0


def test_stream_agrees_with_create_and_the_stream_helper(oai):
    kwargs = {"model": MODEL, "input": QUESTION, "max_output_tokens": 24, "temperature": 0}
    plain = oai.responses.create(**kwargs)
    assert plain.status == "completed" and plain.output_text.strip()

    events = list(oai.responses.create(stream=True, **kwargs))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text == plain.output_text == done.output_text
    assert done.usage.output_tokens == plain.usage.output_tokens

    with oai.responses.stream(**kwargs) as stream:
        helper_text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert helper_text == final.output_text == plain.output_text


@needs_grammar
def test_streamed_function_call(oai):
    events = list(
        oai.responses.create(
            model=MODEL,
            input="What is the weather in Rome?",
            tools=[WEATHER],
            tool_choice="required",
            max_output_tokens=40,
            temperature=0,
            stream=True,
        )
    )
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"]
    assert added[0].item.name == "get_weather" and added[0].item.arguments == ""
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(fragments) == done.arguments and done.name == "get_weather"
    jsonschema.validate(json.loads(done.arguments), CITY_PARAMS)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == done.arguments


def test_refusals_name_the_field(http):
    cases = [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
    ]  # fmt: skip
    for extra, param in cases:
        r = http.post("/v1/responses", json={"model": MODEL, "input": "Hi", **extra})
        assert r.status_code == 400, (extra, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert error["code"] == 400 and error["message"]
    for method in ("GET", "DELETE"):
        r = http.request(method, "/v1/responses/resp_missing")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    body = {"model": MODEL, "input": "Hi", "store": False, "max_output_tokens": 1}
    unstored = http.post("/v1/responses", json=body).json()
    assert unstored["store"] is False
    assert http.get(f"/v1/responses/{unstored['id']}").status_code == 404


@needs_grammar
@pytest.mark.parametrize("api", ["responses", "responses_streamed", "chat_completions"])
def test_openai_agents_sdk_runs_a_function_tool_to_completion(base_url, api):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        cities.append(city)
        return f"Sunny, 21 C in {city}."

    async def run() -> agents.RunResultBase:
        client = openai.AsyncOpenAI(
            base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        model_class = (
            agents.OpenAIChatCompletionsModel
            if api == "chat_completions"
            else agents.OpenAIResponsesModel
        )
        agent = agents.Agent(
            name="weather",
            instructions="Answer with the weather the tool reports.",
            tools=[get_weather],
            model=model_class(model=MODEL, openai_client=client),
            # the first turn must call the tool; then the choice resets to auto and the
            # model answers with the tool's output in its context
            model_settings=agents.ModelSettings(
                tool_choice="required", temperature=0, max_tokens=40
            ),
            reset_tool_choice=True,
        )
        question = "What is the weather in Paris?"
        try:
            if api == "responses_streamed":
                streamed = agents.Runner.run_streamed(agent, question, max_turns=4)
                async for _ in streamed.stream_events():
                    pass
                return streamed
            return await agents.Runner.run(agent, question, max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    # (at temperature 0 this model answers after one call; a second auto-chosen call is allowed)
    assert cities and all(city.strip() for city in cities), cities
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item"
    for item in result.new_items:
        if item.type == "tool_call_item":
            arguments = json.loads(item.raw_item.arguments)
            jsonschema.validate(arguments, get_weather.params_json_schema)
    assert result.new_items[1].output == f"Sunny, 21 C in {cities[0]}."
    assert isinstance(result.final_output, str) and result.final_output.strip()
