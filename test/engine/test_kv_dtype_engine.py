"""--kv-cache-dtype on the real default model through the offline Engine.

Accuracy: greedy first 16 tokens of 12 varied prompts agree with the bf16-KV engine for at
least 10 of them (the agreement and mean |logprob| difference are printed). int8 meets it;
fp8_e4m3 does not (7/12 measured, mean |logprob| difference ~0.04: e4m3 keeps 3 mantissa bits,
a relative error of up to 1/16 on every K and V value, per-row scales or not; Hugging Face's own
model with fake-quantized e4m3 K/V gave 6/12), so its test is a strict xfail that says so. Both runs use the dequantized bf16 weights
(`--quantization unquant`); over the Q4_1 weights kept quantized (the GGUF default) int8 KV
agreed on 9/12 (measured when the two landed together). Prefix sharing, retraction and pages move slot indices, never values: with an int8
pool, outputs are the same cold, from the radix cache, in pages of 16, and under a pool so
small that requests are retracted.
"""

from __future__ import annotations

import pytest

import radixgen
from radixgen.kernels.cpu.loader import GEMM_ENV

pytestmark = pytest.mark.slow  # starts Engines

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain gravity to a child in two sentences.",
    "Translate 'good morning' into Spanish.",
    "What is 17 plus 25?",
    "Name a famous physicist and say why they matter.",
    "Give me a tip for learning to cook.",
    "Describe a rainy day in a city.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet in one sentence.",
]
GREEDY16 = {"temperature": 0, "max_new_tokens": 16}
SHARED = "You are a careful assistant. Answer in one short sentence.\n" * 6
QUESTIONS = ["Who wrote Hamlet?", "What is 2 + 3?", "Name a red fruit.", "What is ice?"]


def _greedy(kv: str, chat_prompt, **kwargs):
    # NOTE: the dequantized bf16 weights (the baseline path), so the KV format is the only change;
    # on the native bf16 GEMM on AMX CPUs too (RADIXGEN_NATIVE_GEMM=1, which the scheduler child
    # inherits): oneDNN's AMX GEMM, their default, is not batch-invariant, so its greedy outputs
    # change with how the 12 prompts happened to be batched (int8 read 9 or 10 of 12 there)
    kwargs.setdefault("quantization", "unquant")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(GEMM_ENV, "1")
        with radixgen.Engine(kv_cache_dtype=kv, grammar_backend="none", **kwargs) as eng:
            outs = eng.generate([chat_prompt(p) for p in PROMPTS], GREEDY16, return_logprob=True)
            info = eng.get_server_info()
    lps = [[lp for lp, _i, _t in o["meta_info"]["output_token_logprobs"]] for o in outs]
    return [o["output_ids"] for o in outs], lps, info


@pytest.fixture(scope="module")
def bf16_reference(chat_prompt):
    ids, lps, info = _greedy("bf16", chat_prompt, max_total_tokens=4096)
    assert info["internal_states"][0]["kv_cache_dtype"] == "bf16"
    return ids, lps


FP8_MISSES = pytest.mark.xfail(
    strict=True, reason="fp8_e4m3 KV agrees with bf16 on 16 tokens for 7/12 prompts, not 10"
)


@pytest.mark.parametrize("kv", ["int8", pytest.param("fp8_e4m3", marks=FP8_MISSES)])
def test_quantized_kv_agrees_with_bf16_on_the_first_16_tokens(kv, bf16_reference, chat_prompt):
    ids, lps, info = _greedy(kv, chat_prompt, max_total_tokens=4096)
    state = info["internal_states"][0]
    assert info["kv_cache_dtype"] == kv and state["kv_cache_dtype"] == kv
    assert info["max_total_num_tokens"] == state["max_total_num_tokens"] == 4096
    ref_ids, ref_lps = bf16_reference
    agree, diffs = 0, []
    for ours, theirs, lp, ref_lp in zip(ids, ref_ids, lps, ref_lps, strict=True):
        agree += ours[:16] == theirs[:16]
        k = 0
        while k < min(len(ours), len(theirs)) and ours[k] == theirs[k]:
            diffs.append(abs(lp[k] - ref_lp[k]))
            k += 1
    mean = sum(diffs) / len(diffs)
    print(f"{kv}: {agree}/{len(PROMPTS)} agree on 16 tokens; mean |logprob diff| {mean:.4f}")
    assert agree >= 10, f"{kv}: only {agree}/12 prompts agree with bf16 on 16 tokens"
    assert mean < 0.1


def _shared_prompts() -> list[str]:
    return [f"{SHARED}Q: {q}\nA:" for q in QUESTIONS]


def test_int8_kv_with_prefix_sharing_pages_and_retraction():
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    with radixgen.Engine(
        kv_cache_dtype="int8", disable_radix_cache=True, grammar_backend="none"
    ) as eng:
        cold = [o["output_ids"] for o in eng.generate(_shared_prompts(), params)]
    for page in (1, 16):
        with radixgen.Engine(
            kv_cache_dtype="int8", page_size=page, max_total_tokens=4096,
            grammar_backend="none", debug_invariants=True,
        ) as eng:  # fmt: skip
            first = eng.generate(_shared_prompts()[:1], params)
            rest = eng.generate(_shared_prompts(), params)
            state = eng.get_server_info()["internal_states"][0]
        assert [o["output_ids"] for o in first] == cold[:1]
        assert [o["output_ids"] for o in rest] == cold, f"page {page}"
        assert all(o["meta_info"]["cached_tokens"] >= 64 for o in rest)
        assert state["kv_cache_dtype"] == "int8" and state["cached_tokens"] > 0
    # a ~72-token shared prefix + 4 x (~10 + 24) tokens overflow 160 slots
    with radixgen.Engine(
        kv_cache_dtype="int8", max_total_tokens=160, grammar_backend="none",
        debug_invariants=True,
    ) as eng:  # fmt: skip
        tight = eng.generate(_shared_prompts(), params)
        state = eng.get_server_info()["internal_states"][0]
    assert [o["output_ids"] for o in tight] == cold
    assert state["retractions"] > 0 or state["evicted_tokens"] > 0
