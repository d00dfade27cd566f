"""The OpenAI backend against our own server's /v1, as chat model and as completion model."""

from __future__ import annotations

import json

import pytest

import radixgen as rg


@rg.function
def chat_then_verdict(s, question):
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=10, temperature=0))
    s += rg.user("Is that answer correct? Say yes or no.")
    s += rg.assistant(rg.select("verdict", choices=["yes", "no"]))


@rg.function
def fire(s):
    s += "Q: Is fire hot or cold?\nA: Fire is"
    s += rg.select("choice", choices=[" hot", " cold"])


def test_chat_model_gen_messages_and_constrained_select(openai_chat):
    state = chat_then_verdict.run(question="What is 2 + 2?", backend=openai_chat)
    assert state["answer"] and state["verdict"] in ("yes", "no")
    assert state.get_meta_info("verdict")["method"] == "constrained"
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[2]["content"] == state["answer"]


def test_chat_model_needs_gen_right_after_assistant(openai_chat):
    @rg.function
    def free_text(s):
        s += "Once upon a time" + rg.gen("story", max_tokens=4)

    error = free_text.run(backend=openai_chat).error()
    assert isinstance(error, rg.ProgramError) and "assistant_begin" in str(error)


def test_chat_model_streaming_and_json_schema(openai_chat):
    @rg.function
    def person(s):
        s += rg.user("Describe a person as JSON.")
        s += rg.assistant(
            rg.gen("person", max_tokens=64, temperature=0, json_schema={
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                               "hobby": {"type": "string", "maxLength": 60}},
                "required": ["name", "age", "hobby"],
            })
        )  # fmt: skip

    # NOTE: tokens that arrive while the client holds a chunk come in the next one, so the
    # chunk count follows the machine's load; with jump-forward, name and age alone are ~4
    # sampled tokens and once came in 2 chunks (full suite, loaded CI machine): the free-text
    # hobby gives the stream enough sampled tokens for "> 2" to test streaming, not timing
    streamed = person.run(stream=True, backend=openai_chat)
    pieces = list(streamed.text_iter("person"))
    assert len(pieces) > 2
    full = person.run(backend=openai_chat)
    assert "".join(pieces) == full["person"]
    assert set(json.loads(full["person"])) == {"name", "age", "hobby"}
    assert isinstance(full.parsed("person")["age"], int)


def test_completion_model_select_scores_like_the_native_backend(openai_completion, endpoint):
    via_openai = fire.run(backend=openai_completion)
    native = fire.run(backend=endpoint)
    assert via_openai["choice"] == native["choice"] == " hot"
    assert via_openai.get_meta_info("choice")["normalized_prompt_logprobs"] == pytest.approx(
        native.get_meta_info("choice")["normalized_prompt_logprobs"], abs=1e-4
    )


def test_completion_model_gen_stop_dtype_and_n(openai_completion):
    @rg.function
    def completion(s):
        s += "Count: one, two, three,"
        s += rg.gen("rest", max_tokens=10, stop=",", temperature=0)
        s += "\nQ: How many legs does a cat have?\nA: " + rg.gen_int("legs", max_tokens=3)
        s += "\nAnother number:" + rg.gen("samples", max_tokens=3, n=2, temperature=1.0)

    state = completion.run(backend=openai_completion, temperature=0)
    assert "," not in state["rest"] and state["rest"]
    assert isinstance(state.parsed("legs"), int)
    assert isinstance(state["samples"], list) and len(state["samples"]) == 2


def test_completion_model_chat_template_and_streaming_logprobs(openai_completion):
    state = chat_then_verdict.run(question="Name a colour.", backend=openai_completion)
    assert state.text().startswith("<|im_start|>system\n")
    assert state["verdict"] in ("yes", "no")
    assert "normalized_prompt_logprobs" in state.get_meta_info("verdict")

    @rg.function
    def counter(s):
        s += "one, two, three,"
        s += rg.gen("rest", max_tokens=4, temperature=0, ignore_eos=True, return_logprob=True)

    streamed = counter.run(stream=True, backend=openai_completion)
    assert len(list(streamed.text_iter("rest"))) >= 2
    assert len(streamed.get_meta_info("rest")["output_token_logprobs"]) == 4


def test_chat_model_select_by_first_token_logprobs(lang_server):
    backend = rg.OpenAI(
        "SmolLM2-135M-Instruct",
        base_url=lang_server.url + "/v1",
        api_key="unused",
        chat_select="first_token_logprobs",
    )

    @rg.function
    def colour(s):
        s += rg.user("What colour is the sky on a clear day? Answer Blue or Green.")
        s += rg.assistant(rg.select("colour", choices=["Blue", "Green"]))

    state = colour.run(backend=backend)
    meta = state.get_meta_info("colour")
    assert state["colour"] in ("Blue", "Green") and meta["method"] == "logprobs"
    assert len(meta["first_token_logprobs"]) == 2
