"""Program-level optimisations, checked on the requests really sent (and their cache hits), each
with its global_config switch on and off."""

from __future__ import annotations

import pytest

import radixgen as rg
from radixgen.lang.constraints import REGEX_INT
from radixgen.lang.ir import SglArgument, SglConstantText, SglGen

SHOTS = "".join(f"Question: What is {i} plus {i}?\nAnswer: {2 * i}\n\n" for i in range(1, 6))


@rg.function
def four_way(s, item):
    s += "Pick the animal.\n" + item + "\nAnswer:"
    s += rg.select("pick", choices=[" cat", " car", " cup", " cloud"])


@rg.function
def few_shot(s, question):
    s += SHOTS + "Question: " + question + "\nAnswer:"
    s += rg.gen("answer", max_tokens=3, stop="\n", temperature=0)


def _generates(endpoint) -> list[dict]:
    return list(endpoint.payloads)


@pytest.mark.parametrize("batched", [True, False])
def test_select_scores_all_choices_in_one_request(endpoint, batched):
    rg.global_config.enable_batched_select = batched
    endpoint.payloads.clear()
    state = four_way.run(item="Options: cat, car, cup, cloud.", backend=endpoint)
    sent = _generates(endpoint)
    assert state["pick"] in (" cat", " car", " cup", " cloud")
    assert all(p["sampling_params"]["max_new_tokens"] == 0 for p in sent)
    scoring = [p for p in sent if p.get("return_logprob")]
    if batched:  # one scoring request, after a prefill of the prefix the server has not seen
        assert len(scoring) == 1 and len(scoring[0]["text"]) == 4
        assert len(sent) == 2 and sent[0]["text"] == state.text()[: -len(state["pick"])]
    else:
        assert len(sent) == len(scoring) == 4 and all(isinstance(p["text"], str) for p in sent)
    assert all(p["logprob_start_len"] > 0 for p in scoring)


def test_select_after_a_gen_is_a_single_request(endpoint):
    @rg.function
    def gen_then_select(s):
        s += "Q: Name an animal.\nA:" + rg.gen("animal", max_tokens=3, stop="\n", temperature=0)
        s += rg.select("mark", choices=[".", "!"])

    endpoint.payloads.clear()
    gen_then_select.run(backend=endpoint)
    scoring = _generates(endpoint)[1:]  # the text so far was the gen's prompt and output
    assert len(scoring) == 1 and isinstance(scoring[0]["text"], list)


def test_batched_and_unbatched_select_score_the_same(endpoint):
    scores = {}
    for batched in (True, False):
        rg.global_config.enable_batched_select = batched
        state = four_way.run(item="Options: cat, car, cup, cloud.", backend=endpoint)
        scores[batched] = state.get_meta_info("pick")["normalized_prompt_logprobs"]
    assert scores[True] == pytest.approx(scores[False], abs=1e-3)


@pytest.mark.parametrize("precache", [True, False])
def test_fork_prefills_the_shared_prefix_first(endpoint, precache):
    rg.global_config.enable_fork_precache = precache

    @rg.function
    def branches(s):
        s += SHOTS + "Now three more:\n"
        forks = s.fork(3)
        forks += lambda i: f"Question {i}:" + rg.gen("q", max_tokens=3, stop="\n", temperature=0)
        forks.join()

    rg.flush_cache(endpoint)
    endpoint.payloads.clear()
    branches.run(backend=endpoint)
    sent = _generates(endpoint)
    prefills = [p for p in sent if p["sampling_params"]["max_new_tokens"] == 0]
    if precache:
        assert len(prefills) == 1 and prefills[0]["text"] == SHOTS + "Now three more:\n"
        assert sent[0] is prefills[0], "the prefix goes out before any branch"
    else:
        assert not prefills
    assert len(sent) - len(prefills) == 3


def test_fork_branches_hit_the_radix_cache(endpoint):
    @rg.function
    def branches(s):
        s += SHOTS + "Next:\n"
        forks = s.fork(3)
        forks += rg.gen("q", max_tokens=2, temperature=0)
        metas = [f.get_meta_info("q") for f in forks]
        forks.join()
        return metas

    rg.flush_cache(endpoint)
    state = branches.run(backend=endpoint)
    assert len(state["q"]) == 3
    prefix_tokens = endpoint.count_prompt_tokens(SHOTS + "Next:\n")
    assert all(meta["cached_tokens"] >= prefix_tokens - 2 for meta in state.ret_value)


@pytest.mark.parametrize("precache", [True, False])
def test_run_batch_caches_the_traced_prefix_once(endpoint, precache):
    rg.global_config.enable_precache_with_tracing = precache
    rg.flush_cache(endpoint)
    endpoint.payloads.clear()
    questions = [{"question": f"What is {i} plus 1?"} for i in range(4)]
    states = few_shot.run_batch(questions, backend=endpoint, num_threads=4)
    sent = _generates(endpoint)
    assert all(s["answer"] is not None for s in states)
    prefills = [p for p in sent if p["sampling_params"]["max_new_tokens"] == 0]
    if precache:
        assert len(prefills) == 1 and prefills[0]["text"] == SHOTS + "Question: "
        assert sent[0] is prefills[0]
    else:
        assert not prefills


def test_trace_returns_the_program_ir(endpoint):
    ir = few_shot.trace(backend=endpoint)
    kinds = [type(n) for n in ir.nodes]
    assert kinds == [SglConstantText, SglArgument, SglConstantText, SglGen]
    assert ir.constant_prefix() == SHOTS + "Question: "
    assert "Gen('answer')" in ir.print()
    assert few_shot.cache(backend=endpoint) == SHOTS + "Question: "


@pytest.mark.parametrize("constrained", [True, False])
def test_choices_and_dtype_use_the_grammar_not_retries(endpoint, constrained):
    rg.global_config.enable_constrained_decoding = constrained

    @rg.function
    def typed(s):
        s += "Q: How many legs does a dog have?\nA: " + rg.gen("legs", dtype=int, max_tokens=4)
        s += "\nQ: Is the sun hot?\nA:" + rg.gen(
            "hot", choices=[" yes", " no"], choices_method=rg.constrained_choice
        )

    endpoint.payloads.clear()
    state = typed.run(backend=endpoint, temperature=0)
    if state.error() is not None:  # free text that never parses is the cost of turning it off
        assert not constrained and "no output matched dtype int" in str(state.error())
        return
    sent = _generates(endpoint)
    params = [p["sampling_params"] for p in sent]
    assert state["hot"] in (" yes", " no") and isinstance(state.parsed("legs"), int)
    if constrained:
        assert len(sent) == 2
        assert params[0]["regex"] == REGEX_INT and {" ", "\n"} <= set(params[0]["stop"])
        assert params[1]["choices"] == [" yes", " no"]
    else:
        assert all("regex" not in p and "choices" not in p for p in params)
        assert state.get_meta_info("legs")["attempts"] >= 1
