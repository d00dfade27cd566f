"""Tool-call and reasoning parsers as plain functions: each format parsed whole, and streamed in
arbitrary chunk splits whose deltas, joined as the openai client joins them, equal the full parse."""

from __future__ import annotations

import json
import random

import pytest
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string

from radixgen.reasoning_parser import REASONING_PARSER_NAMES, ReasoningParser
from radixgen.runtime.entrypoints.openai import tool_calls as tc
from radixgen.runtime.entrypoints.openai.chat_deltas import (
    ChatDeltaBuilder,
    ToolCallStreamer,
    openai_deltas,
)
from radixgen.runtime.entrypoints.openai.protocol import Tool
from radixgen.runtime.entrypoints.openai.tool_call_grammar import forced_call_constraint
from radixgen.runtime.entrypoints.openai.tool_parsers import (
    TOOL_CALL_PARSER_NAMES,
    TOOL_CALL_PARSERS,
    create_tool_call_parser,
)
from radixgen.server_args import ParserConfig, ServerArgs

TOOLS = [
    Tool.model_validate({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
                                         "days": {"type": "integer"}},
        "required": ["city"]}}}),
    Tool.model_validate({"type": "function", "function": {"name": "now"}}),
]  # fmt: skip
NAMES = {t.function.name for t in TOOLS}
WEATHER = {"city": "Paris", "days": 2}

# (parser, reply text, expected content, expected [(name, arguments object)])
CASES = [
    ("qwen25", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
     "Let me check.", [("get_weather", WEATHER), ("now", {})]),
    ("qwen25", '<tool_call>{"arguments": {"city": "Paris", "days": 2}, "name": "get_weather"}</tool_call>',
     None, [("get_weather", WEATHER)]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"days\\": 2}"}</tool_call>',
     None, [("get_weather", WEATHER)]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
     None, [("get_weather", WEATHER)]),
    ("llama3", 'Sure.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; {"name": "now", "parameters": {}}',
     "Sure.", [("get_weather", WEATHER), ("now", {})]),
    ("mistral", 'Calling. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, {"name": "now", "arguments": {}}]',
     "Calling.", [("get_weather", WEATHER), ("now", {})]),
    ("pythonic", "[get_weather(city='Paris', days=2), now()]", None, [("get_weather", WEATHER), ("now", {})]),
    ("pythonic", 'Look at [1, 2] first. [get_weather(city="Paris", days=2)]',
     "Look at [1, 2] first.", [("get_weather", WEATHER)]),
]  # fmt: skip

NOT_CALLS = [
    ("qwen25", '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'),
    ("llama3", '{"answer": 42}'),
    ("llama3", "Plain words, no call."),
    ("mistral", '[TOOL_CALLS] [{"name": "nope", "arguments": {}}]'),
    ("pythonic", "[get_weather(1)]"),
    ("pythonic", "A list [a, b] and [now"),
]


def stream(builder: ChatDeltaBuilder, text: str, rng: random.Random) -> dict:
    """Feed `text` in random cumulative chunks; join the deltas as the openai client does."""
    out: dict = {"content": "", "reasoning_content": "", "tool_calls": {}}
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    deltas = [builder.update(text[:c]) for c in [*cuts, len(text)]]
    last, has_calls = builder.finish(text)
    for d in [x for merged in [*deltas, last] for x in openai_deltas(merged)]:
        assert len(d.get("tool_calls", [])) <= 1, "OpenAI sends one tool-call entry a chunk"
        out["content"] += d.get("content", "")
        out["reasoning_content"] += d.get("reasoning_content", "")
        for entry in d.get("tool_calls", []):
            call = out["tool_calls"].setdefault(entry["index"], {"arguments": ""})
            if "id" in entry:  # the first entry of a call: id, type and the whole name
                assert "name" not in call and entry["function"]["arguments"] == ""
                call.update(id=entry["id"], name=entry["function"]["name"])
            else:
                assert "name" in call, "argument fragments come after the name"
            call["arguments"] += entry["function"].get("arguments", "")
    out["has_calls"] = has_calls
    return out


def tools_builder(
    parser_name: str, max_calls: int | None = None, prefix: str = ""
) -> ChatDeltaBuilder:
    parser = create_tool_call_parser(parser_name)
    return ChatDeltaBuilder(None, True, ToolCallStreamer(parser, NAMES, max_calls, prefix))


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_parse_and_stream_agree(name, text, content, calls):
    parsed_content, parsed = create_tool_call_parser(name).parse(text, NAMES)
    assert parsed_content == content
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed
    ] == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in parsed)
    for seed in range(25):
        got = stream(tools_builder(name), text, random.Random(seed))
        assert got["has_calls"] and got["content"] == (content or "")
        streamed = [got["tool_calls"][i] for i in sorted(got["tool_calls"])]
        assert [(c["name"], c["arguments"]) for c in streamed] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in parsed
        ], seed


@pytest.mark.parametrize(("name", "text"), NOT_CALLS)
def test_replies_without_valid_calls_stay_content(name, text):
    assert create_tool_call_parser(name).parse(text, NAMES) == (text, [])
    for seed in range(10):
        got = stream(tools_builder(name), text, random.Random(seed))
        assert got["content"] == text and not got["tool_calls"] and not got["has_calls"]


def test_a_call_cut_short_after_its_name_stays_announced_when_streamed():
    """Streaming commits to a call once its whole name is out; a reply cut there (finish_reason
    "length") keeps that call with the arguments generated so far. Unstreamed, it is content."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": '
    assert create_tool_call_parser("qwen25").parse(text, NAMES) == (text, [])
    got = stream(tools_builder("qwen25"), text, random.Random(0))
    assert got["has_calls"] and got["content"] == ""
    assert got["tool_calls"][0]["name"] == "get_weather"
    assert got["tool_calls"][0]["arguments"] == '{"city": '


def test_content_streams_before_the_call_and_a_possible_tag_is_held_back():
    b = tools_builder("qwen25")
    assert b.update("Hello <tool") == {"content": "Hello"}
    assert b.update("Hello <tool_call>{") == {}
    g = tools_builder("mistral")
    assert g.update("a [TOOL") == {"content": "a"}
    assert g.update("a [TOOLS] b") == {"content": " [TOOLS] b"}


def test_name_first_then_argument_fragments():
    b = tools_builder("qwen25")
    assert b.update('<tool_call>{"name": "get_wea') == {}
    first = b.update('<tool_call>{"name": "get_weather", "arguments": {"ci')
    entry, fragment = first["tool_calls"]
    assert (entry["index"], entry["type"], entry["function"]) == (
        0, "function", {"name": "get_weather", "arguments": ""})  # fmt: skip
    assert fragment == {"index": 0, "function": {"arguments": '{"ci'}}
    more = b.update('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}')
    assert more == {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Rome"}'}}]}
    p = tools_builder("pythonic")
    assert p.update("[get_weather(") == {}  # named with its first argument: f(1) is no call
    assert p.update("[get_weather(city='Ro") == {}
    entry, fragment = p.update("[get_weather(city='Rome', ")["tool_calls"]
    assert entry["function"] == {"name": "get_weather", "arguments": ""}
    assert fragment["function"] == {"arguments": '{"city": "Rome"'}
    assert p.update("[get_weather(city='Rome', days=1)]") == {
        "tool_calls": [{"index": 0, "function": {"arguments": ', "days": 1}'}}]
    }


@pytest.mark.parametrize("name", ["qwen25", "llama3", "mistral", "pythonic"])
def test_parallel_tool_calls_false_keeps_the_first_call(name):
    text = next(t for n, t, _, calls in CASES if n == name and len(calls) == 2)
    _, calls = create_tool_call_parser(name).parse(text, NAMES, max_calls=1)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    got = stream(tools_builder(name, max_calls=1), text, random.Random(0))
    assert [c["name"] for c in got["tool_calls"].values()] == ["get_weather"]


@pytest.mark.parametrize("name", ["qwen25", "llama3", "mistral", "pythonic"])
@pytest.mark.parametrize("mode", ["required", "get_weather"])
def test_forced_call_grammar_accepts_a_call_that_parses(name, mode):
    parser = create_tool_call_parser(name)
    constraint = forced_call_constraint(parser, TOOLS, mode)
    ((kind, spec),) = constraint.items()
    grammar = (
        Grammar.from_json_schema(json.dumps(spec))
        if kind == "json_schema"
        else Grammar.from_ebnf(spec)
    )
    call = {"name": "get_weather", parser.arguments_key: {"city": "Paris", "days": 2}}
    reply = {
        "qwen25": json.dumps(call),
        "llama3": json.dumps(call),
        "mistral": json.dumps([call]),
        "pythonic": '[get_weather(city="Paris", days=2)]',
    }[name]
    assert _is_grammar_accept_string(grammar, reply), (kind, reply)
    wrong = reply.replace("get_weather", "get_time")
    assert not _is_grammar_accept_string(grammar, wrong)
    _, calls = parser.parse(parser.forced_prefix + reply, NAMES, 1)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}


def test_pythonic_grammar_types_the_arguments():
    grammar = Grammar.from_ebnf(forced_call_constraint(
        create_tool_call_parser("pythonic"), TOOLS, "get_weather")["ebnf"])  # fmt: skip
    for ok in ['[get_weather(city="Oslo")]', '[get_weather(city="Oslo", unit="c", days=3)]']:
        assert _is_grammar_accept_string(grammar, ok), ok
    for bad in [
        "[get_weather(days=3)]",
        "[get_weather(city=3)]",
        '[get_weather(city="a", unit="k")]',
    ]:
        assert not _is_grammar_accept_string(grammar, bad), bad


def test_history_is_rendered_in_the_parser_format():
    msgs = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}]  # fmt: skip
    for name, parser_cls in TOOL_CALL_PARSERS.items():
        text = tc.history_messages(msgs, parser_cls())[0]["content"]
        _, calls = parser_cls().parse(text, NAMES)
        assert [c["function"]["name"] for c in calls] == ["now"], name


def test_parser_choice_by_flag_and_by_template():
    assert create_tool_call_parser(None).name == "qwen25"
    assert create_tool_call_parser(None, "{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert create_tool_call_parser(None, "<|python_tag|>").name == "llama3"
    assert create_tool_call_parser("pythonic", "[TOOL_CALLS]").name == "pythonic"
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(ParserConfig)}
    assert fields["tool_call_parser"].metadata["choices"] == TOOL_CALL_PARSER_NAMES
    assert fields["reasoning_parser"].metadata["choices"] == REASONING_PARSER_NAMES
    assert ServerArgs.from_kwargs(tool_call_parser="llama3").parsers.tool_call_parser == "llama3"
    with pytest.raises(Exception, match="tool_call_parser"):
        ServerArgs.from_kwargs(tool_call_parser="nope")


# --- reasoning -------------------------------------------------------------------------------

REASONING_CASES = [
    (
        "deepseek-r1",
        "Let me think.</think>\n\nThe answer is 4.",
        "Let me think.",
        "The answer is 4.",
    ),
    ("deepseek-r1", "<think>\nhmm\n</think>4", "\nhmm\n", "4"),
    ("deepseek-r1", "still thinking when cut", "still thinking when cut", ""),
    ("qwen3", "<think>a < b</think>yes", "a < b", "yes"),
    ("qwen3", "No thinking here.", None, "No thinking here."),
    ("qwen3", "<thing>", None, "<thing>"),
    ("qwen3-thinking", "x</think>y", "x", "y"),
]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), REASONING_CASES)
@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_reasoning_parse_and_stream_agree(name, text, reasoning, content, stream_reasoning):
    parser = ReasoningParser(name)
    assert parser.parse(text) == (reasoning, content)
    for seed in range(25):
        got = stream(ChatDeltaBuilder(parser, stream_reasoning, None), text, random.Random(seed))
        assert (got["reasoning_content"], got["content"]) == (reasoning or "", content), seed


def test_reasoning_is_held_until_its_end_without_stream_reasoning():
    b = ChatDeltaBuilder(ReasoningParser("deepseek-r1"), False, None)
    assert b.update("abc") == {}
    assert b.update("abc</thi") == {}
    assert b.update("abc</think>x") == {"reasoning_content": "abc", "content": "x"}
    s = ChatDeltaBuilder(ReasoningParser("deepseek-r1"), True, None)
    assert s.update("abc</thi") == {"reasoning_content": "abc"}


def test_qwen3_enable_thinking_false_keeps_the_reply_whole():
    assert ReasoningParser("qwen3", enabled=False).parse("<think>x</think>y") == (
        None,
        "<think>x</think>y",
    )


def test_reasoning_then_tool_call_streams():
    parser = create_tool_call_parser("qwen25")
    text = '<think>need weather</think>\n<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    b = ChatDeltaBuilder(ReasoningParser("qwen3"), True, ToolCallStreamer(parser, NAMES, None))
    got = stream(b, text, random.Random(3))
    assert got["reasoning_content"] == "need weather" and got["content"] == ""
    assert [(c["name"], c["arguments"]) for c in got["tool_calls"].values()] == [("now", "{}")]


@pytest.mark.parametrize("name", ["qwen25", "mistral"])
def test_a_forced_call_streams_with_the_prompt_prefix(name):
    """A forced reply continues the format's opening that ended the prompt."""
    parser = create_tool_call_parser(name)
    call = json.dumps({"name": "get_weather", "arguments": WEATHER})
    reply = call if name == "qwen25" else f"[{call}]"
    b = ChatDeltaBuilder(None, True, ToolCallStreamer(parser, NAMES, 1, parser.forced_prefix))
    got = stream(b, reply, random.Random(1))
    assert got["content"] == "" and got["has_calls"]
    assert json.loads(got["tool_calls"][0]["arguments"]) == WEATHER
    broken = ChatDeltaBuilder(None, True, ToolCallStreamer(parser, NAMES, 1, parser.forced_prefix))
    assert stream(broken, "no call", random.Random(1))["content"] == "no call"


def test_pythonic_grammar_with_only_optional_arguments():
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}}}})  # fmt: skip
    grammar = Grammar.from_ebnf(forced_call_constraint(
        create_tool_call_parser("pythonic"), [tool], "f")["ebnf"])  # fmt: skip
    for ok in ["[f()]", "[f(a=-3)]", "[f(a=1, b=True)]"]:
        assert _is_grammar_accept_string(grammar, ok), ok
    for bad in ["[f(a=1.5)]", "[f(b=1)]", "[f(a=1, )]", "[g()]"]:
        assert not _is_grammar_accept_string(grammar, bad), bad


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_the_openai_sdks_stream_accumulator_reads_our_chunks(name, text, content, calls):
    """Our chunks through the openai SDK's own `chat.completions.stream` state: every call
    (parallel ones too) comes out once, whole, with its id and name."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    builder = tools_builder(name)
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 9)))
    merged = [builder.update(text[:c]) for c in [*cuts, len(text)]]
    last, has_calls = builder.finish(text)
    deltas = [{"role": "assistant", "content": ""}]
    deltas += [d for m in [*merged, last] for d in openai_deltas(m)]
    state = ChatCompletionStreamState()
    for k, delta in enumerate([*deltas, {}]):
        reason = "tool_calls" if k == len(deltas) else None
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}  # fmt: skip
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    message = state.get_final_completion().choices[0].message
    assert has_calls and (message.content or "") == (content or "")
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    assert got == calls
    assert all(c.id and c.id.startswith("call_") for c in message.tool_calls or [])
