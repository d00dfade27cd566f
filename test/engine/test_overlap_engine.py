"""Overlap scheduling on the real default model (CPU, forced on): the same outputs, logprobs
and finish reasons as the synchronous scheduler for greedy, seeded sampling with penalties,
stop strings, n > 1 and a shared prefix (issue 13, item 4)."""

from __future__ import annotations

from typing import Any

import pytest

import radixgen

pytestmark = pytest.mark.slow  # two Engines (real model, real processes)

PARAMS: list[dict[str, Any]] = [
    {"temperature": 0, "max_new_tokens": 12},
    {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 11, "max_new_tokens": 12,
     "frequency_penalty": 0.4, "repetition_penalty": 1.2},
    {"temperature": 0, "max_new_tokens": 24, "stop": [".", "\n"]},
    {"temperature": 0.7, "seed": 5, "max_new_tokens": 8, "n": 2},
    {"temperature": 0, "max_new_tokens": 1},
    {"temperature": 0, "max_new_tokens": 10, "logit_bias": {"30": 3.0}, "min_new_tokens": 6},
]  # fmt: skip


def _outputs(overlap: bool, prompts: list[str]) -> list[Any]:
    kwargs = {"enable_overlap_schedule": True} if overlap else {}
    with radixgen.Engine(grammar_backend="none", log_level="warning", **kwargs) as eng:
        outs = eng.generate(prompts, PARAMS, return_logprob=True, top_logprobs_num=2)
        info = eng.get_server_info()
    assert info["enable_overlap_schedule"] is overlap
    return [
        (o["text"], o["output_ids"], o["meta_info"]["finish_reason"],
         [round(lp, 4) for lp, _, _ in o["meta_info"]["output_token_logprobs"]])
        for o in (x for out in outs for x in (out if isinstance(out, list) else [out]))
    ]  # fmt: skip


def test_overlap_on_and_off_give_the_same_outputs(chat_prompt):
    shared = "You are a terse assistant. Answer in one short sentence. "
    prompts = [chat_prompt(shared + q) for q in (
        "What is the capital of France?", "Name a colour.", "Count to five.",
        "What is two plus two?", "Say hello.", "Name a planet.",
    )]  # fmt: skip
    off = _outputs(False, prompts)
    on = _outputs(True, prompts)
    assert on == off
