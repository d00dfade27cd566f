"""Every DSL primitive on the real default model, through both native backends (our HTTP server
and the in-process Engine): gen, roles, select, constraints, fork/join, batch, streaming."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from pydantic import BaseModel, Field

import radixgen as rg
from radixgen.lang.choices import normalized_prompt_logprob


@rg.function
def chat_answer(s, question):
    s += rg.system("You are a helpful assistant.")
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=10, temperature=0))


@rg.function
def hot_or_cold(s, method=rg.token_length_normalized):
    s += "Q: Is fire hot or cold?\nA: Fire is"
    s += rg.select("choice", choices=[" hot", " cold"], choices_method=method)


def test_gen_stop_is_trimmed_and_text_appended(backend):
    @rg.function
    def count(s):
        s += "Count: one, two, three,"
        s += rg.gen("rest", max_tokens=12, stop=",", temperature=0)
        s += "!"

    state = count.run(backend=backend)
    rest = state["rest"]
    assert "," not in rest and rest.strip(), rest
    assert state.text() == "Count: one, two, three," + rest + "!"
    meta = state.get_meta_info("rest")
    assert meta["finish_reason"]["type"] == "stop" and meta["completion_tokens"] <= 12


def test_gen_stop_regex_stops_at_the_first_match_and_trims_it(backend):
    @rg.function
    def count(s):
        s += "Count: 1, 2, 3,"
        s += rg.gen("rest", max_tokens=16, temperature=0, ignore_eos=True)
        s += "!"

    full = count.run(backend=backend)["rest"]
    digit = re.search(r"\d", full)
    assert digit is not None and digit.start() > 0, full
    pattern = r"(?<=\D)\d+"  # a number after a non-digit: matches where `digit` begins
    state = count.run(backend=backend, stop_regex=pattern)
    assert state["rest"] == full[: digit.start()]
    assert state.text() == "Count: 1, 2, 3," + state["rest"] + "!"
    assert state.get_meta_info("rest")["finish_reason"] == {"type": "stop", "matched": pattern}


def test_roles_render_the_models_template_and_messages(backend):
    state = chat_answer.run(question="What is the capital of France?", backend=backend)
    answer = state["answer"]
    assert answer and "<|im_end|>" not in answer
    assert state.messages() == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": answer},
    ]
    assert state.text() == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        f"<|im_start|>assistant\n{answer}<|im_end|>\n"
    )


def test_default_system_prompt_and_role_blocks(backend):
    @rg.function
    def no_system(s):
        with s.user():
            s += "Say hi."
        s += rg.assistant_begin()
        s += rg.gen("reply", max_tokens=4, temperature=0)
        s += rg.assistant_end()

    state = no_system.run(backend=backend)
    assert state.messages()[0] == {
        "role": "system",
        "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    }
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]


@pytest.mark.parametrize(
    "method", [rg.token_length_normalized, rg.greedy_token_selection,
               rg.unconditional_likelihood_normalized],
    ids=["token_length", "greedy", "unconditional"],
)  # fmt: skip
def test_select_scoring_methods(backend, method):
    state = hot_or_cold.run(method=method, backend=backend)
    assert state["choice"] in (" hot", " cold")
    assert state.text().endswith(state["choice"])
    meta = state.get_meta_info("choice")
    rows = meta["input_token_logprobs"]
    assert len(rows) == 2 and all(row for row in rows)
    # SGLang's rule: mean of the non-null logprobs of `prefix + choice` from two tokens before
    # the end of the prefix; the choice tokens are the end of each row
    assert meta["normalized_prompt_logprobs"] == pytest.approx(
        [normalized_prompt_logprob(r) for r in rows]
    )
    assert rows[0][-1][2] == " hot" and rows[1][-1][2] == " cold"
    if method is rg.token_length_normalized:
        assert state["choice"] == " hot"  # the one sanity fact a 135M model gets right
    if method is rg.unconditional_likelihood_normalized:
        assert len(meta["normalized_unconditional_prompt_logprobs"]) == 2


def test_select_refuses_sampling(backend):
    @rg.function
    def sampled(s):
        s += "Pick:" + rg.select("x", choices=["a", "b"], temperature=0.7)

    error = sampled.run(backend=backend).error()
    assert isinstance(error, rg.ProgramError) and "temperature must be 0" in str(error)


def test_dtypes_and_regex_are_constrained(backend):
    @rg.function
    def typed(s):
        s += "Q: How many legs does a dog have?\nA: "
        s += rg.gen_int("legs", max_tokens=4)
        s += "\nQ: What is pi?\nA: " + rg.gen("pi", dtype=float, max_tokens=6)
        s += "\nQ: Is water wet?\nA: " + rg.gen("wet", dtype=bool, max_tokens=3)
        s += "\nQ: Name a colour.\nA: " + rg.gen_string("colour", max_tokens=8)
        s += "\nQ: Year of the moon landing?\nA: " + rg.gen("year", regex=r"(19|20)[0-9]{2}")

    state = typed.run(backend=backend, temperature=0)
    assert isinstance(state.parsed("legs"), int) and state["legs"] == str(state.parsed("legs"))
    assert isinstance(state.parsed("pi"), float)
    assert state["wet"] in ("True", "False") and isinstance(state.parsed("wet"), bool)
    assert re.fullmatch(r'"[\w\s]*"', state["colour"]), state["colour"]
    assert re.fullmatch(r"(19|20)[0-9]{2}", state["year"]), state["year"]


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def test_json_schema_dict_string_and_pydantic(backend):
    schema = City.model_json_schema()

    @rg.function
    def cities(s):
        s += rg.user("Give a city and its country as JSON.")
        with s.assistant():
            s += rg.gen("as_dict", max_tokens=40, temperature=0, json_schema=schema)
        s += rg.user("Another one.")
        with s.assistant():
            s += rg.gen("as_text", max_tokens=40, temperature=0, json_schema=json.dumps(schema))
        s += rg.user("One more.")
        with s.assistant():
            s += rg.gen("as_model", max_tokens=40, temperature=0, json_schema=City)

    state = cities.run(backend=backend)
    for name in ("as_dict", "as_text", "as_model"):
        assert isinstance(state[name], str)
        assert set(json.loads(state[name])) == {"name", "country"}
    assert isinstance(state.parsed("as_dict"), dict)
    assert isinstance(state.parsed("as_model"), City)


def test_gen_choices_scores_them_like_sglangs_select(backend):
    """SGLang's gen(choices=...) is a select with token_length_normalized: same decision and the
    select's meta (normalized_prompt_logprobs per choice)."""

    @rg.function
    def pick(s, how):
        s += "The sky on a clear day is"
        if how == "gen":
            s += rg.gen("colour", choices=[" blue", " green", " red"])
        else:
            s += rg.select("colour", choices=[" blue", " green", " red"])

    by_gen, by_select = (pick.run(how, backend=backend) for how in ("gen", "select"))
    assert by_gen["colour"] == by_select["colour"] in (" blue", " green", " red")
    assert by_gen.text() == "The sky on a clear day is" + by_gen["colour"]
    meta = by_gen.get_meta_info("colour")
    assert set(meta) >= {"normalized_prompt_logprobs", "input_token_logprobs",
                         "output_token_logprobs"}  # fmt: skip
    assert meta["normalized_prompt_logprobs"] == pytest.approx(
        by_select.get_meta_info("colour")["normalized_prompt_logprobs"], abs=1e-4
    )  # two forward passes of the same text: equal up to float noise
    best = max(range(3), key=lambda i: meta["normalized_prompt_logprobs"][i])
    assert by_gen["colour"] == [" blue", " green", " red"][best]


def test_constrained_choice_decodes_under_a_grammar(backend):
    @rg.function
    def pick(s):
        s += "The sky on a clear day is"
        s += rg.gen("colour", choices=[" blue", " green", " red"],
                    choices_method=rg.constrained_choice)  # fmt: skip
        s += " and grass is" + rg.select("grass", choices=[" green", " blue"],
                                         choices_method=rg.constrained_choice)  # fmt: skip

    state = pick.run(backend=backend)
    assert state["colour"] in (" blue", " green", " red")
    assert state["grass"] in (" green", " blue")
    assert (
        state.text() == f"The sky on a clear day is{state['colour']} and grass is{state['grass']}"
    )
    assert "normalized_prompt_logprobs" not in state.get_meta_info(
        "colour"
    )  # generated, not scored


def test_fork_gathers_variables_and_concatenates_text(backend):
    @rg.function
    def branches(s):
        s += "List three fruits.\n"
        forks = s.fork(3)
        forks += lambda i: (
            f"Fruit {i + 1}:" + rg.gen("fruit", max_tokens=4, stop="\n", temperature=0)
        )
        forks.join()
        s += "Done."
        more = s.fork(2)
        more[0] += " A"
        more[1] += " B"
        more.join(mode="concate_and_append")

    state = branches.run(backend=backend)
    fruits = state["fruit"]
    assert isinstance(fruits, list) and len(fruits) == 3 and all(isinstance(f, str) for f in fruits)
    assert state.text() == "List three fruits.\nDone. A B"


def test_join_keeps_the_parents_variables_as_sglang_does(backend):
    """A name the parent already has at join time keeps the parent's value; two fork groups
    joined one after the other each contribute only names that are still new."""

    @rg.function
    def clash(s):
        s += "Q:"
        forks = s.fork(2)
        forks += rg.gen("y", max_tokens=2, temperature=0)
        s += rg.gen("y", max_tokens=1, temperature=0)  # the parent sets y after the fork
        forks.join()
        first = s.fork(2)
        second = s.fork(2)
        first += rg.gen("z", max_tokens=1, temperature=0)
        second += rg.gen("z", max_tokens=1, temperature=0)
        first.join()
        second.join()

    state = clash.run(backend=backend)
    assert isinstance(state["y"], str)  # the parent's own value, not a list
    assert isinstance(state["z"], list) and len(state["z"]) == 2


def test_copy_var_scope_bind_and_n(backend):
    @rg.function
    def prog(s, topic, other="cats"):
        with s.var_scope("intro"):
            s += "A short note about " + topic + " and " + other + "."
        with s.copy() as c:
            c += " Side:" + rg.gen("side", max_tokens=3, temperature=0)
        s += " Main:" + rg.gen("many", max_tokens=3, n=2, temperature=1.0)

    bound = prog.bind(other="dogs")
    state = bound.run(topic="birds", backend=backend)
    assert state["intro"] == "A short note about birds and dogs."
    assert isinstance(state["side"], list) and len(state["side"]) == 1
    assert isinstance(state["many"], list) and len(state["many"]) == 2
    assert " Side:" not in state.text() and "intro" in state


def test_run_batch_keeps_order_and_errors(backend):
    questions = [{"question": q} for q in ("Name a colour.", "Name an animal.", "Name a city.")]
    states = chat_answer.run_batch(questions, backend=backend, num_threads=2, progress_bar=True)
    assert [s.messages()[1]["content"] for s in states] == [q["question"] for q in questions]
    assert all(s.error() is None and s["answer"] for s in states)
    positional = chat_answer.run_batch([("Name a fruit.",)], backend=backend)
    assert positional[0]["answer"]
    generated = chat_answer.run_batch(questions[:2], backend=backend, generator_style=True)
    assert [s.messages()[1]["content"] for s in generated] == [q["question"] for q in questions[:2]]


def test_streaming_text_iter_matches_the_unstreamed_result(backend):
    @rg.function
    def counter(s):
        s += "Count to five: one, two,"
        s += rg.gen("rest", max_tokens=6, temperature=0, ignore_eos=True, return_logprob=True)

    state = counter.run(stream=True, backend=backend)
    pieces = list(state.text_iter("rest"))
    assert len(pieces) >= 2, "streamed in several chunks"
    full = counter.run(backend=backend)
    assert "".join(pieces) == full["rest"] == state["rest"]
    assert len(state.get_meta_info("rest")["output_token_logprobs"]) == 6

    async def collect():
        chunks, logprobs = [], 0
        async for delta, meta in counter.run(stream=True, backend=backend).text_async_iter(
            "rest", return_meta_data=True
        ):
            chunks.append(delta)
            logprobs += len(meta["output_token_logprobs"])
        return "".join(chunks), logprobs

    text, logprobs = asyncio.run(collect())
    assert text == full["rest"] and logprobs == 6
    whole = "".join(counter.run(stream=True, backend=backend).text_iter())
    assert whole == "Count to five: one, two," + full["rest"]


def test_text_async_iter_read_after_the_end_carries_every_entry(backend):
    """A reader that only looks once the gen has ended sees all its chunks as one item: that
    item carries every token's entries, top logprobs included (none lost in the merge)."""

    @rg.function
    def counter(s):
        s += "Count to five: one, two,"
        s += rg.gen("rest", max_tokens=6, temperature=0, ignore_eos=True, return_logprob=True,
                    top_logprobs_num=2)  # fmt: skip

    async def read_after_the_end():
        state = counter.run(stream=True, backend=backend)
        await asyncio.to_thread(state.stream_executor.variable_event["rest"].wait)
        return [item async for item in state.text_async_iter("rest", return_meta_data=True)]

    items = asyncio.run(read_after_the_end())
    assert len(items) == 1
    meta = items[0][1]
    assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == 6
    assert all(len(row) == 2 for row in meta["output_top_logprobs"])


def test_backend_control_and_default_backend(backend):
    info = rg.get_server_info(backend)
    assert info["version"] and info["internal_states"]
    flushed = rg.flush_cache(backend)
    assert flushed is None or flushed["success"] in (True, False)
    engine = getattr(backend, "engine", None)
    rg.set_default_backend(engine if engine is not None else backend)
    assert rg.global_config.default_backend.get_chat_template() == backend.get_chat_template()
    state = chat_answer.run(question="Say yes.")  # no backend= : the default one
    assert list(state.text_iter("answer")) == [state["answer"]]  # not streaming: one item
