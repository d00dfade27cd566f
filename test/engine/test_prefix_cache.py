"""RadixAttention end to end on the real model: same outputs with the cache on and off, growing
cached_tokens across chat turns, memory pressure (eviction, retraction), policies and pages."""

from __future__ import annotations

import threading

import pytest
from wait_helpers import wait_until

import radixgen

pytestmark = pytest.mark.slow  # starts Engines (cache on/off, policies, pool pressure)

FEW_SHOT = (
    "Answer with one word.\n"
    + "".join(f"Q: What color is a {thing}?\nA: {color}\n" for thing, color in [
        ("banana", "yellow"), ("leaf", "green"), ("sky", "blue"), ("coal", "black"),
        ("snow", "white"), ("tomato", "red"), ("orange", "orange"), ("grape", "purple"),
    ])
)  # fmt: skip
QUESTIONS = ["cherry", "lemon", "cucumber", "blueberry", "milk", "crow", "pumpkin", "lime"]
GREEDY = {"temperature": 0, "max_new_tokens": 12}


def _prompts() -> list[str]:
    return [f"{FEW_SHOT}Q: What color is a {q}?\nA:" for q in QUESTIONS]


@pytest.fixture(scope="module")
def engine():
    """The default engine (radix cache on, FCFS); a small pool keeps debug accounting cheap."""
    with radixgen.Engine(
        max_total_tokens=4096, grammar_backend="none", debug_invariants=True, log_level="warning"
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def no_cache_outputs():
    with radixgen.Engine(
        disable_radix_cache=True, grammar_backend="none", log_level="warning"
    ) as eng:
        outs = eng.generate(_prompts(), GREEDY)
        state = eng.get_server_info()["internal_states"][0]
    assert state["cached_tokens"] == 0
    return [o["output_ids"] for o in outs]


def _same_outputs_with_cache(eng, no_cache_outputs):
    eng.flush_cache()
    outs = eng.generate(_prompts(), GREEDY)
    again = eng.generate(_prompts(), GREEDY)
    state = eng.get_server_info()["internal_states"][0]
    assert [o["output_ids"] for o in outs] == no_cache_outputs
    assert [o["output_ids"] for o in again] == no_cache_outputs
    # the shared few-shot prefix is computed once, not once per prompt
    prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    assert sum(o["meta_info"]["cached_tokens"] for o in outs) > 0.6 * prompt_tokens
    assert all(
        o["meta_info"]["cached_tokens"] >= o["meta_info"]["prompt_tokens"] - 8 for o in again
    )
    assert state["cache_hit_rate"] > 0.6


def test_cache_on_gives_the_same_greedy_outputs(engine, no_cache_outputs):
    _same_outputs_with_cache(engine, no_cache_outputs)


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policies_give_the_same_greedy_outputs(no_cache_outputs, policy):
    with radixgen.Engine(
        schedule_policy=policy,
        max_total_tokens=4096,
        grammar_backend="none",
        debug_invariants=True,
        log_level="warning",
    ) as eng:
        _same_outputs_with_cache(eng, no_cache_outputs)


def test_multi_turn_chat_reports_growing_cached_tokens(engine):
    tok = engine.tokenizer
    messages: list[dict[str, str]] = []
    cached = []
    for turn in ["Hi! My name is Ada.", "What is my name?", "Spell it backwards.", "Thanks!"]:
        messages.append({"role": "user", "content": turn})
        out = engine.generate(
            tok.apply_chat_template(messages), {"temperature": 0, "max_new_tokens": 16}
        )
        messages.append({"role": "assistant", "content": out["text"]})
        cached.append(out["meta_info"]["cached_tokens"])
    assert cached[0] < cached[1] < cached[2] < cached[3], cached


def test_pool_pressure_evicts_then_retracts_without_changing_outputs(engine):
    # 8 prompts share a 116-token prefix; with their own 5 + 12 tokens each they overflow 180 slots
    with radixgen.Engine(
        max_total_tokens=180, grammar_backend="none", debug_invariants=True, log_level="warning"
    ) as eng:
        outs = eng.generate(_prompts(), {**GREEDY, "ignore_eos": True})
        state = eng.get_server_info()["internal_states"][0]
    ref = engine.generate(_prompts(), {**GREEDY, "ignore_eos": True})
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
    assert state["retractions"] > 0 or state["evicted_tokens"] > 0


def test_retraction_under_decode_pressure(engine):
    """Long generations outgrow the pool mid-decode: the newest requests go back to the queue."""
    prompts = [f"Story {i}: Once upon a time" for i in range(6)]
    params = {"temperature": 0, "max_new_tokens": 90, "ignore_eos": True}
    with radixgen.Engine(
        max_total_tokens=400, grammar_backend="none", debug_invariants=True, log_level="warning"
    ) as eng:
        outs = eng.generate(prompts, params)
        state = eng.get_server_info()["internal_states"][0]
    ref = engine.generate(prompts, params)
    assert state["retractions"] > 0
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert all(len(o["output_ids"]) == 90 for o in outs)


def test_paged_cache_matches_whole_pages(no_cache_outputs):
    with radixgen.Engine(
        page_size=4,
        max_total_tokens=4096,
        grammar_backend="none",
        debug_invariants=True,
        log_level="warning",
    ) as eng:
        outs = eng.generate(_prompts(), GREEDY)
        again = eng.generate(_prompts()[:2], GREEDY)
    assert [o["output_ids"] for o in outs] == no_cache_outputs
    for o in again:
        assert o["meta_info"]["cached_tokens"] % 4 == 0 and o["meta_info"]["cached_tokens"] > 0


def test_flush_cache_refused_while_running_then_allowed(engine):
    engine.generate(_prompts()[:2], GREEDY)
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(
            out=engine.generate(
                "Tell me a long story.", {"max_new_tokens": 200, "ignore_eos": True}
            )
        )
    )
    worker.start()
    wait_until(
        lambda: engine.get_server_info()["internal_states"][0]["running_requests"],
        2.0,
        interval=0.02,
        what="the story to be running",
    )
    refused = engine.flush_cache()
    worker.join()
    assert not refused["success"]
    assert "running" in refused["message"]
    assert engine.flush_cache()["success"]
    assert engine.get_server_info()["internal_states"][0]["cache_evictable_tokens"] == 0
    fresh = engine.generate(_prompts()[0], GREEDY)
    assert fresh["meta_info"]["cached_tokens"] == 0
