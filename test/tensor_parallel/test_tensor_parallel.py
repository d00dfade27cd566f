"""`--tp-size N` through the real Engine: N scheduler rank processes over gloo, the model split by
heads, MLP columns and vocabulary rows, produce the greedy tokens of the one-process model.

The test model (tp_model.py) is float32 with 8 q / 2 KV heads and a vocabulary of 1000 (padded
to 1024: the last rank holds padding rows that must never be sampled). The row-parallel sums
change the float32 summation order, so logits agree to a tolerance, not bit for bit: the test
first asserts that every greedy choice of the reference has a top-2 gap far above it, then
compares tokens exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import radixgen as rg

from .tp_model import build_tp_model, prompts

pytestmark = pytest.mark.slow  # starts real engine processes (3-4 s each on 2 cores)

LOGPROB_TOL = 1e-4
MIN_TOP2_GAP = 1e-2  # 100x the tolerance: a reference choice this decisive cannot flip
SAMPLING = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
# a hot, seeded sample: every vocabulary row gets probability, so a padding row that reached the
# sampler would be drawn; rank 0 samples alone, so the draws equal one process's
HOT = {"max_new_tokens": 48, "temperature": 2.0, "seed": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    # seed 3: the smallest top-2 log-prob gap over these requests' greedy steps is 0.05 (seeds
    # 2 and 5 have one under 0.004, where float32 reordering could decide)
    return build_tp_model(tmp_path_factory.mktemp("tp-model"), seed=3)


def _requests() -> list[list[int]]:
    """4 unrelated prompts, then a pair sharing a 24-token prefix (the second one reads it from
    the radix cache: the shared KV slots must be right on every rank)."""
    shared = prompts(1, 24, seed=7)[0]
    return [*prompts(4, 12, seed=1), [*shared, 5, 6, 7], [*shared, 8, 9]]


_runs_sampled: dict[tuple[int, tuple[str, ...]], list[int]] = {}


def _run(folder: Path, tp: int, **extra: object) -> tuple[list[dict], list[dict]]:
    """The requests' outputs, and each scheduler's internal state after them."""
    engine = rg.Engine(
        model_path=str(folder), tp_size=tp, dtype="float32", max_total_tokens=4096,
        num_threads=1, grammar_backend="none", log_level="warning", **extra,
    )  # fmt: skip
    try:
        reqs = _requests()
        first = engine.generate(
            input_ids=reqs[:-1], sampling_params=SAMPLING, return_logprob=True, top_logprobs_num=2
        )
        last = engine.generate(
            input_ids=reqs[-1], sampling_params=SAMPLING, return_logprob=True, top_logprobs_num=2
        )
        hot = engine.generate(input_ids=prompts(1, 8, seed=11)[0], sampling_params=HOT)
        _runs_sampled[tp, tuple(sorted(extra))] = hot["output_ids"]
        return [*first, last], engine.get_server_info()["internal_states"]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def reference(folder) -> list[dict]:
    outs, _ = _run(folder, 1)
    for out in outs:  # the reference is decisive everywhere (else the test proves nothing)
        for top in out["meta_info"]["output_top_logprobs"]:
            assert top[0][0] - top[1][0] > MIN_TOP2_GAP, top
    assert outs[-1]["meta_info"]["cached_tokens"] >= 24
    return outs


def _same_as_reference(outs: list[dict], reference: list[dict]) -> None:
    for out, ref in zip(outs, reference, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        assert all(0 <= t < 1000 for t in out["output_ids"])  # never a padding row
        ours = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        theirs = [lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < LOGPROB_TOL
    assert outs[-1]["meta_info"]["cached_tokens"] == reference[-1]["meta_info"]["cached_tokens"]


def test_tp2_greedy_equals_tp1(folder, reference):
    _same_as_reference(_run(folder, 2)[0], reference)
    sampled, expected = _runs_sampled[2, ()], _runs_sampled[1, ()]
    assert sampled == expected and all(t < 1000 for t in sampled)


def test_tp4_with_replicated_kv_heads_equals_tp1(folder, reference):
    """2 KV heads over 4 ranks: each rank keeps one, ranks 2r and 2r+1 the same one."""
    _same_as_reference(_run(folder, 4)[0], reference)


def test_two_replicas_of_tp2_groups_equal_tp1(folder, reference):
    """--dp-size 2 --tp-size 2: two independent groups (own file stores, 4 processes), the DP
    controller routing between their rank-0 schedulers."""
    outs, states = _run(folder, 2, dp_size=2, load_balance_method="cache_aware")
    _same_as_reference(outs, reference)
    assert len(states) == 2 and all(s["prompt_tokens"] > 0 for s in states), states


def test_dp_attention_equals_tp1(folder, reference):
    """--enable-dp-attention over 2 ranks: the first 5 requests (nothing shared) spread over
    both (ranks with different batch sizes); the last one, routed cache-aware to the rank that
    holds its prefix in its own radix cache, runs alone while the other rank runs idle forwards
    (the MLP collectives only)."""
    outs, states = _run(
        folder, 2, dp_size=2, enable_dp_attention=True, load_balance_method="cache_aware"
    )
    _same_as_reference(outs, reference)
    assert all(s["prompt_tokens"] > 0 for s in states), states  # both ranks had requests
    assert sum(s["dp_attention_idle_forwards"] for s in states) > 0, states


def test_dp_attention_needs_one_replica_per_rank(folder):
    with pytest.raises(ValueError, match="--enable-dp-attention needs --tp-size N > 1 and --dp"):
        rg.Engine(model_path=str(folder), tp_size=2, enable_dp_attention=True)


def test_a_split_the_model_refuses_is_a_precise_error_before_any_start(folder):
    with pytest.raises(ValueError, match="--tp-size 3 does not divide the model's 8 attention"):
        rg.Engine(model_path=str(folder), tp_size=3, dtype="float32")
