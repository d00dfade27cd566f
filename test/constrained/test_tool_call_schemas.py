"""Forced tool calls whose parameters hold `$defs` / `definitions` / `$ref` (pydantic writes them for
every nested model and enum): the call grammar moves the parameters under a new root, so their
pointers must be rewritten, on every backend and in every JSON call format."""

from __future__ import annotations

import enum
import json
from typing import Any

import jsonschema
import pytest
from grammar_helpers import BACKENDS, EOS, spec_text
from pydantic import BaseModel

from radixgen.runtime.entrypoints.openai.protocol import Tool
from radixgen.runtime.entrypoints.openai.tool_call_grammar import forced_call_constraint
from radixgen.runtime.entrypoints.openai.tool_parsers import create_tool_call_parser


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str


class Weather(BaseModel):
    place: Place
    unit: Unit


class Node(BaseModel):  # recursive: the root itself is a `$ref` into `$defs`
    label: str
    children: list[Node]


def tool(name: str, parameters: dict[str, Any]) -> Tool:
    return Tool.model_validate(
        {"type": "function", "function": {"name": name, "parameters": parameters}}
    )


WEATHER = tool("get_weather", Weather.model_json_schema())
TREE = tool("tree", Node.model_json_schema())
# draft-7 `definitions` and a pointer to a sibling property, as hand-written schemas have them
LEGACY = tool(
    "legacy",
    {
        "type": "object",
        "definitions": {"Unit": {"enum": ["c", "f"]}},
        "properties": {
            "unit": {"$ref": "#/definitions/Unit"},
            "again": {"$ref": "#/properties/unit"},
        },
        "required": ["unit", "again"],
        "additionalProperties": False,
    },
)
# a second tool with its own `Place`: clashing definition names
ORDER_CLASH = tool(
    "order",
    {
        "type": "object",
        "$defs": {"Place": {"type": "object", "properties": {"shop": {"type": "integer"}},
                            "required": ["shop"], "additionalProperties": False}},
        "properties": {"place": {"$ref": "#/$defs/Place"}},
        "required": ["place"],
        "additionalProperties": False,
    },
)  # fmt: skip

ARGS = {
    "get_weather": {"place": {"city": "Paris", "country": "France"}, "unit": "celsius"},
    "order": {"place": {"shop": 7}},
    "tree": {"label": "a", "children": [{"label": "b", "children": []}]},
    "legacy": {"unit": "c", "again": "f"},
}
BAD_ARGS = {
    "get_weather": {"place": {"city": "Paris", "country": "France"}, "unit": "kelvin"},
    "order": {"place": {"city": "Paris", "country": "France"}},
    "tree": {"label": "a", "children": [{"label": "b"}]},
    "legacy": {"unit": "c", "again": "k"},
}
CASES = [
    ([WEATHER], "get_weather", "get_weather"),
    ([TREE], "tree", "tree"),
    ([LEGACY], "legacy", "legacy"),
    ([WEATHER, ORDER_CLASH], "required", "get_weather"),
    ([WEATHER, ORDER_CLASH], "required", "order"),
]


def call_text(parser_name: str, name: str, args: dict[str, Any]) -> str:
    parser = create_tool_call_parser(parser_name)
    body = json.dumps({"name": name, parser.arguments_key: args}, separators=(",", ":"))
    return f"[{body}]" if parser_name == "mistral" else body


@pytest.fixture
def build(compiled):
    def make(name: str, constraint: dict[str, Any]):
        ((kind, spec),) = constraint.items()
        backend, grammar = compiled(name, kind, spec_text(kind, spec))
        return backend.create_grammar(grammar)

    return make


def walks(grammar, ids: list[int]) -> bool:
    return grammar.accept_tokens(ids) == len(ids) and grammar.accept_token(EOS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("parser_name", ["qwen25", "llama3", "mistral"])
@pytest.mark.parametrize(("tools", "mode", "called"), CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_nested_tool_parameters_constrain_the_call(
    build, encode, backend, parser_name, tools, mode, called
):
    constraint = forced_call_constraint(create_tool_call_parser(parser_name), tools, mode)
    schema = constraint["json_schema"]
    good = call_text(parser_name, called, ARGS[called])
    bad = call_text(parser_name, called, BAD_ARGS[called])
    jsonschema.validate(json.loads(good), schema)  # the rewritten pointers resolve
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(bad), schema)
    assert walks(build(backend, constraint), encode(good))
    assert not walks(build(backend, constraint), encode(bad))


def test_definitions_keep_their_names_for_one_tool_and_are_prefixed_for_several():
    parser = create_tool_call_parser("qwen25")
    one = forced_call_constraint(parser, [WEATHER], "get_weather")["json_schema"]
    assert sorted(one["$defs"]) == ["Place", "Unit"]
    assert one["properties"]["arguments"]["properties"]["place"] == {"$ref": "#/$defs/Place"}
    several = forced_call_constraint(parser, [WEATHER, ORDER_CLASH], "required")["json_schema"]
    assert sorted(several["$defs"]) == ["get_weather.Place", "get_weather.Unit", "order.Place"]
    legacy = forced_call_constraint(parser, [LEGACY], "legacy")["json_schema"]
    assert legacy["properties"]["arguments"]["properties"]["again"] == {
        "$ref": "#/properties/arguments/properties/unit"
    }
    # data is not rewritten: a "$ref" key inside an enum or default is a value
    data = tool("d", {"type": "object", "properties": {"x": {"enum": [{"$ref": "#/a"}]}}})
    got = forced_call_constraint(parser, [data], "d")["json_schema"]
    assert got["properties"]["arguments"]["properties"]["x"]["enum"] == [{"$ref": "#/a"}]


def test_pythonic_calls_type_values_behind_refs(build, encode):
    """The pythonic format's grammar follows a property's local `$ref` (an enum of pydantic's
    writes one) so its values stay typed."""
    parser = create_tool_call_parser("pythonic")
    schema = {"type": "object", "$defs": {"Unit": {"enum": ["celsius", "fahrenheit"]}},
              "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "required": ["unit"]}  # fmt: skip
    constraint = forced_call_constraint(parser, [tool("f", schema)], "f")
    assert walks(build("xgrammar", constraint), encode('[f(unit="celsius")]'))
    assert not walks(build("xgrammar", constraint), encode('[f(unit="kelvin")]'))
