"""N-gram speculative decoding in the scheduler, on real KV pools with the toy runner.

Outputs with speculation equal the toy model's reference token for token (the toy model reads
every token back through req_to_token, so a draft slot kept by mistake, or a rejected one whose
KV leaks into the next step, changes the outputs), for a model that repeats itself (drafts
accepted) and one that does not (drafts rejected), in mixed batches, with pages, chunking and
pool pressure; `debug_invariants` checks the KV accounting after every step.
"""

from __future__ import annotations

import pytest
from toy_runner import VOCAB, make_scheduler, next_token, run_to_end, submit

from radixgen.errors import InvalidRequestError
from radixgen.finish_reason import FinishReason
from radixgen.io_struct import AbortReq
from radixgen.runtime.speculative.ngram import DraftState, NgramIndex
from radixgen.server_args import ServerArgs

SPEC = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 6}
PERIOD = 11


def copy_model(ids: list[int]) -> int:
    """A model that repeats its last PERIOD tokens (what n-gram drafts predict well)."""
    return ids[-PERIOD] if len(ids) >= PERIOD else 1


def reference(prompt: list[int], n: int, model=next_token) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(model(ids))
    return ids[len(prompt) :]


def prompts(count: int) -> list[list[int]]:
    return [[(7 * i + 3 * j) % (VOCAB - 1) + 1 for j in range(20 + 9 * i)] for i in range(count)]


def run(model, reqs: list[tuple[str, list[int], int]], **flags):
    s, runner = make_scheduler(**flags)
    runner.predict = model
    for rid, prompt, n in reqs:
        submit(s, rid, prompt, max_new_tokens=n)
    return run_to_end(s), s, runner


def test_ngram_index_proposes_after_the_longest_latest_match():
    idx = NgramIndex(1, 3)
    toks = [1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3]
    # suffix [2, 3] last occurred before 4 (its latest occurrence wins over the one before 9)
    assert idx.propose(toks, 3) == [4, 5, 2]
    toks += [4]  # grows incrementally: [2, 3, 4] now matches at position 5
    assert idx.propose(toks, 2) == [5, 2]
    assert NgramIndex(2, 3).propose([5, 6, 7], 4) == []  # no earlier [6, 7]
    assert idx.propose(toks, 0) == []


def test_draft_length_adapts_to_acceptance():
    st = DraftState(1, 4, draft_len=2)
    st.record(2, 2, max_len=8)
    assert st.draft_len == 4
    st.record(4, 1, max_len=8)
    assert st.draft_len == 2 and st.cooldown == 0
    st.record(2, 0, max_len=8)
    st.record(1, 0, max_len=8)
    assert st.draft_len == 1 and st.cooldown == 3  # sits out steps after repeated misses
    assert [st.should_draft(0.0) for _ in range(4)] == [0, 0, 0, 1]
    st.record(1, 1, max_len=8)
    assert st.should_draft(0.0) == 2
    # below the threshold that pays: a one-token probe, then PROBE_INTERVAL steps without drafts
    assert st.should_draft(0.9) == 1 and not any(st.should_draft(0.9) for _ in range(8))


@pytest.mark.parametrize("model", [copy_model, next_token], ids=["repeats", "random"])
@pytest.mark.parametrize(
    "flags", [{}, {"page_size": 4}, {"chunked_prefill_size": 16}, {"disable_radix_cache": True}]
)
def test_outputs_equal_the_reference_in_mixed_batches(model, flags):
    reqs = [(f"r{i}", p, 30 + 7 * i) for i, p in enumerate(prompts(5))]
    out, s, runner = run(model, reqs, **SPEC, **flags)
    for rid, prompt, n in reqs:
        ids, reason = out[rid]
        assert ids == reference(prompt, n, model), rid
        assert reason == FinishReason.length(n)
    st = s.internal_state()
    assert st["spec_verified_requests"] > 0 and st["generated_tokens"] == sum(n for *_, n in reqs)
    if model is copy_model:
        assert st["spec_accept_length"] > 3.0
        _, _, base_runner = run(model, reqs, **flags)
        assert len(runner.batches) < len(base_runner.batches) / 2  # fewer forward steps
        # a step mixes verify rows, plain decodes and prefills
        assert any(max(b.extend_lens) > 1 and 1 in b.extend_lens for b in runner.batches)
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


def test_stop_tokens_and_max_new_tokens_cut_inside_an_accepted_draft():
    prompt = prompts(1)[0]
    full = reference(prompt, 40, copy_model)
    stop = full[17]
    first = full.index(stop)
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "stop", prompt, max_new_tokens=40, stop_token_ids=[stop])
    submit(s, "len", prompt, max_new_tokens=13)
    out = run_to_end(s)
    assert out["stop"] == (full[: first + 1], FinishReason.stop(stop))
    assert out["len"] == (full[:13], FinishReason.length(13))


def test_streaming_sends_every_token_once_in_order():
    prompt = prompts(2)[1]
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "s", prompt, max_new_tokens=50, stream=True)
    chunks: list[list[int]] = []
    while s.has_work:
        for batch in s.step():
            chunks.extend(batch.new_token_ids)
    assert [t for c in chunks for t in c] == reference(prompt, 50, copy_model)
    assert max(len(c) for c in chunks) > 1  # several verified tokens per message


def test_abort_mid_speculation_frees_everything():
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    for i, p in enumerate(prompts(3)):
        submit(s, f"r{i}", p, max_new_tokens=200)
    for _ in range(6):
        s.step()
    s.abort(AbortReq("r1"))
    out = run_to_end(s)
    assert out["r1"][1].kind == "abort"
    assert out["r0"][0] == reference(prompts(3)[0], 200, copy_model)
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


def test_a_short_pool_runs_drafts_only_where_they_fit():
    reqs = [(f"r{i}", p, 120) for i, p in enumerate(prompts(4))]
    out, _, _ = run(copy_model, reqs, pool_tokens=640, **SPEC)
    for rid, prompt, n in reqs:
        assert out[rid][0] == reference(prompt, n, copy_model)


def test_penalised_and_greedy_only_sampled_requests_decode_without_drafts():
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "p", prompts(1)[0], max_new_tokens=20, frequency_penalty=0.5)
    run_to_end(s)
    assert s.spec_stats.spec_verified_requests == 0
    s, runner = make_scheduler(speculative_greedy_only=True, **SPEC)
    runner.predict = copy_model
    submit(s, "t", prompts(1)[0], max_new_tokens=20, temperature=0.5)
    run_to_end(s)
    assert s.spec_stats.spec_verified_requests == 0


def test_a_large_batch_switches_drafting_off():
    reqs = [(f"r{i}", p, 12) for i, p in enumerate(prompts(6))]
    out, s, _ = run(copy_model, reqs, speculative_max_verify_tokens=4, **SPEC)
    assert s.spec_stats.spec_skipped_steps > 0
    for rid, prompt, n in reqs:
        assert out[rid][0] == reference(prompt, n, copy_model)


def test_flags_are_checked():
    with pytest.raises(InvalidRequestError, match="NGRAM"):
        ServerArgs.from_kwargs(speculative_algorithm="EAGLE")
    with pytest.raises(InvalidRequestError, match="overlap"):
        ServerArgs.from_kwargs(speculative_algorithm="NGRAM", enable_overlap_schedule=True)
    with pytest.raises(InvalidRequestError, match="max_match"):
        ServerArgs.from_kwargs(
            speculative_algorithm="NGRAM",
            speculative_ngram_min_match_window_size=4,
            speculative_ngram_max_match_window_size=2,
        )


def test_drafts_that_do_not_pay_are_mostly_skipped():
    reqs = [(f"r{i}", p, 60) for i, p in enumerate(prompts(5))]
    drafted = {}

    def half_copy(ids: list[int]) -> int:  # drafts of a few tokens hit, longer ones miss
        return copy_model(ids) if len(ids) % 3 else next_token(ids)

    for even in (1, 10_000):  # a step is dear at once / almost free
        out, s, _ = run(half_copy, reqs, speculative_break_even_tokens=even, **SPEC)
        assert all(out[rid][0] == reference(p, n, half_copy) for rid, p, n in reqs)
        drafted[even] = s.spec_stats.spec_draft_tokens
    assert 0 < drafted[1] < drafted[10_000] / 2


def test_sampled_verification_keeps_the_samples_and_their_distribution():
    """Sampled requests (temperature 0.25 over the toy logits: the copy token has probability
    e^4 / (e^4 + 49) ~ 0.53, every other token the rest shared evenly) with drafts of the copy
    tokens: over 1,500 seeds the outputs equal those without speculation, seed for seed; the
    number of copy tokens among the 5 outputs is Binomial(5, p), each position alone
    Bernoulli(p), and the other tokens are uniform (chi-square tests at the 0.1% level; the
    seeds are fixed, so the test is deterministic)."""
    import math

    n_req, n_out, temp = 1500, 5, 0.25
    weight = math.exp(1 / temp)
    p = weight / (weight + VOCAB - 1)
    prompt = prompts(1)[0][:22]
    s, runner = make_scheduler(
        pool_tokens=16384,
        speculative_max_verify_tokens=1000,  # every request drafts in every step
        speculative_break_even_tokens=100_000,
        **SPEC,
    )
    runner.predict = copy_model
    for i in range(n_req):
        submit(s, f"r{i}", prompt, max_new_tokens=n_out, temperature=temp, seed=i, ignore_eos=True)
    out = run_to_end(s)
    st = s.spec_stats
    assert st.spec_accepted_tokens > 1000 and st.spec_draft_tokens > st.spec_accepted_tokens + 1000
    # each row draws with the request's own uniform for that position: the very same samples
    base, base_runner = make_scheduler(pool_tokens=16384)
    base_runner.predict = copy_model
    for i in range(n_req):
        submit(
            base, f"r{i}", prompt, max_new_tokens=n_out, temperature=temp, seed=i, ignore_eos=True
        )
    assert run_to_end(base) == out
    preds = reference(prompt, n_out, copy_model)  # the copy tokens come from the prompt alone
    hits = [sum(t == c for t, c in zip(out[f"r{i}"][0], preds, strict=True)) for i in range(n_req)]
    expected = [n_req * math.comb(n_out, h) * p**h * (1 - p) ** (n_out - h) for h in range(6)]
    observed = [hits.count(h) for h in range(6)]
    assert _chi2(observed, expected) < 20.5  # df 5
    for j in range(n_out):
        at_j = sum(out[f"r{i}"][0][j] == preds[j] for i in range(n_req))
        assert _chi2([at_j, n_req - at_j], [n_req * p, n_req * (1 - p)]) < 10.8  # df 1
    others = [0.0] * VOCAB
    seen = [0] * VOCAB
    for i in range(n_req):
        for t, c in zip(out[f"r{i}"][0], preds, strict=True):
            if t != c:
                seen[t] += 1
                for v in range(VOCAB):
                    others[v] += (v != c) / (VOCAB - 1)
    assert _chi2(seen, others) < 90.0  # df 49


def _chi2(observed: list[int], expected: list[float]) -> float:
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)


def test_a_seeded_sampled_request_is_the_same_alone_and_in_a_batch():
    prompt = prompts(3)[2]
    params = {"temperature": 0.3, "seed": 11, "ignore_eos": True}
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "alone", prompt, max_new_tokens=40, **params)
    alone = run_to_end(s)["alone"][0]
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    for i, p in enumerate(prompts(4)):
        submit(s, f"o{i}", p, max_new_tokens=30 + i)
    submit(s, "batched", prompt, max_new_tokens=40, **params)
    assert run_to_end(s)["batched"][0] == alone
    assert s.spec_stats.spec_accepted_tokens > 0
