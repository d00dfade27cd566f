"""Scheduler planning on real KV pools and the real radix cache, with a toy runner (milliseconds).

Admission, prefix matching and locking, chunked prefill, eviction, retraction, the running-set
limit, the cache-aware policy, aborts and refusals: each test checks both the plan (what ran in
which step, what was locked or cached) and that every output equals the toy model's reference,
which breaks if any KV slot was lost or shared wrongly. `debug_invariants` checks the KV
accounting after every step.
"""

from __future__ import annotations

from toy_runner import make_scheduler, reference_output, run_to_end, submit

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import AbortReq

PROMPT = [7, 3, 9, 4, 1, 8, 2, 6] * 8  # 64 tokens


def test_outputs_equal_the_reference_and_finish_by_length():
    s, _ = make_scheduler()
    for i in range(4):
        submit(s, f"r{i}", [i + 1, *PROMPT[i:]], max_new_tokens=10)
    out = run_to_end(s)
    for i in range(4):
        ids, reason = out[f"r{i}"]
        assert ids == reference_output([i + 1, *PROMPT[i:]], 10)
        assert reason == FinishReason.length(10)
    assert s.stats.generated_tokens == 40 and not s.running and not s.waiting


def test_a_shared_prefix_is_matched_locked_and_reused():
    s, runner = make_scheduler()
    submit(s, "first", PROMPT, max_new_tokens=4)
    run_to_end(s)
    submit(s, "second", [*PROMPT, 5, 5], max_new_tokens=4)
    s.step()  # admission and prefill of the new tail only
    req = s.running[0]
    assert req.cached_tokens == len(PROMPT)
    assert req.cache_protected_len == len(PROMPT) + 2  # its whole prompt is shared once computed
    assert runner.batches[-1].prefix_lens == [len(PROMPT)]
    assert runner.batches[-1].extend_lens == [2]
    assert s.cache.protected_size() >= len(PROMPT)  # locked while the request runs
    out = run_to_end(s)
    assert out["second"][0] == reference_output([*PROMPT, 5, 5], 4)
    assert s.cache.protected_size() == 0  # unlocked when it finished
    assert s.stats.cached_tokens == len(PROMPT)


def test_chunked_prefill_splits_the_prompt_by_the_budget():
    s, runner = make_scheduler(chunked_prefill_size=16)
    prompt = list(range(1, 41)) * 2  # 80 tokens
    submit(s, "long", prompt, max_new_tokens=3)
    out = run_to_end(s)
    assert [b.extend_lens for b in runner.batches[:5]] == [[16]] * 5
    assert [b.extend_lens for b in runner.batches[5:]] == [[1], [1]]
    assert out["long"][0] == reference_output(prompt, 3)


def test_decodes_run_beside_a_prefill_chunk():
    s, runner = make_scheduler(chunked_prefill_size=16)
    submit(s, "short", [1, 2, 3], max_new_tokens=6)
    s.step()
    submit(s, "long", list(range(1, 49)), max_new_tokens=2)
    s.step()
    assert runner.batches[-1].extend_lens == [1, 16]  # decodes do not spend the prefill budget
    out = run_to_end(s)
    assert out["short"][0] == reference_output([1, 2, 3], 6)
    assert out["long"][0] == reference_output(list(range(1, 49)), 2)


def test_max_running_requests_bounds_the_batch():
    s, runner = make_scheduler(max_running_requests=2)
    for i in range(5):
        submit(s, f"r{i}", [i + 1, 2, 3, 4], max_new_tokens=5)
    out = run_to_end(s)
    assert max(b.batch_size for b in runner.batches) == 2
    assert all(out[f"r{i}"][0] == reference_output([i + 1, 2, 3, 4], 5) for i in range(5))


def test_eviction_frees_unlocked_cache_for_new_requests():
    s, _ = make_scheduler(pool_tokens=256)
    for i in range(6):  # each leaves ~70 tokens in the cache: more than the pool holds
        submit(s, f"r{i}", [i + 1, *PROMPT], max_new_tokens=5)
        out = run_to_end(s)
        assert out[f"r{i}"][0] == reference_output([i + 1, *PROMPT], 5)
    assert s.stats.evicted_tokens > 0
    assert s.cache.evictable_size() <= 256 and s.cache.protected_size() == 0


def test_retraction_when_the_pool_runs_short_keeps_outputs_identical():
    s, _ = make_scheduler(pool_tokens=160)
    prompts = {f"r{i}": [i + 1, *PROMPT[: 20 + i]] for i in range(4)}
    for rid, prompt in prompts.items():
        submit(s, rid, prompt, max_new_tokens=40)
    out = run_to_end(s)
    assert s.stats.retractions > 0  # 4 x (~22 + 40) tokens cannot all fit in 160
    for rid, prompt in prompts.items():
        ids, reason = out[rid]
        assert ids == reference_output(prompt, 40) and reason == FinishReason.length(40)


def _first_admitted(policy: str) -> tuple[str, list[int]]:
    """One slot; PROMPT cached; "cold" (nothing cached) arrives before "hot" (PROMPT + 1)."""
    s, runner = make_scheduler(max_running_requests=1, schedule_policy=policy)
    submit(s, "warm", PROMPT, max_new_tokens=1)
    run_to_end(s)
    submit(s, "cold", [9, 9, 9, 9, 9, 9], max_new_tokens=3)
    submit(s, "hot", [*PROMPT, 3], max_new_tokens=3)
    s.step()
    (first,) = (r.rid for r in s.running)
    prefix_lens = runner.batches[-1].prefix_lens
    run_to_end(s)
    return first, prefix_lens


def test_lpm_admits_the_longest_cached_prefix_first():
    # the later arrival goes first, for its cached prefix
    assert _first_admitted("lpm") == ("hot", [len(PROMPT)])


def test_fcfs_admits_in_arrival_order():
    assert _first_admitted("fcfs") == ("cold", [0])


def test_in_batch_sharing_defers_the_second_request_until_the_first_is_cached():
    s, runner = make_scheduler()
    long_prefix = list(range(1, 49))
    submit(s, "a", [*long_prefix, 1], max_new_tokens=2)
    submit(s, "b", [*long_prefix, 2], max_new_tokens=2)
    s.step()
    assert runner.batches[0].batch_size == 1  # b waits: its prefix is being computed
    s.step()
    assert runner.batches[1].prefix_lens[-1] == len(long_prefix)  # b reuses a's prefill
    out = run_to_end(s)
    assert out["b"][0] == reference_output([*long_prefix, 2], 2)


def test_abort_of_waiting_and_running_requests_frees_their_kv():
    s, _ = make_scheduler(max_running_requests=1)
    submit(s, "running", PROMPT, max_new_tokens=50)
    submit(s, "waiting", PROMPT[:10], max_new_tokens=50)
    s.step()
    s.handle(AbortReq(rid="waiting"))
    s.handle(AbortReq(rid="running"))
    out = run_to_end(s)
    assert out["waiting"][1] == FinishReason.abort("aborted by the client", 499)
    assert out["running"][1] == FinishReason.abort("aborted by the client", 499)
    assert not s.running and s.cache.protected_size() == 0
    free = s.kv_pool.available_size() + s.cache.evictable_size()
    assert free == s.kv_pool.size  # every slot is free or evictable cache


def test_bad_requests_finish_with_a_400_and_others_carry_on():
    s, _ = make_scheduler(pool_tokens=128)
    submit(s, "empty", [], max_new_tokens=4)
    submit(s, "too_long", PROMPT * 2, max_new_tokens=4)
    submit(s, "fine", PROMPT[:8], max_new_tokens=4)
    out = run_to_end(s)
    assert out["empty"][1] == FinishReason.abort("the prompt is empty", 400)
    reason = out["too_long"][1]
    assert reason.status_code == 400 and "exceeds the limit of 128 tokens" in reason.message
    assert out["fine"][0] == reference_output(PROMPT[:8], 4)


def test_constrained_request_refused_without_a_grammar_backend():
    s, _ = make_scheduler()
    submit(s, "c", PROMPT[:8], regex="[0-9]+")
    out = run_to_end(s)
    assert out["c"][1] == FinishReason.abort(
        "constrained decoding is off (grammar_backend=none)", 400
    )


def test_stop_token_and_stop_string_finish_with_what_matched():
    s, _ = make_scheduler()
    ref = reference_output(PROMPT, 10)
    submit(s, "tok", PROMPT, max_new_tokens=10, stop_token_ids=[ref[3]])
    letters = "".join(chr(ord("a") + i % 26) for i in ref)
    submit(s, "str", PROMPT, max_new_tokens=10, stop=[letters[5:7]])
    out = run_to_end(s)
    first_tok = ref.index(ref[3])
    assert out["tok"] == (ref[: first_tok + 1], FinishReason.stop(ref[3]))
    ids, reason = out["str"]
    assert reason == FinishReason.stop(letters[5:7]) and ids == ref[: len(ids)]
    assert letters[5:7] in letters[: len(ids)]


def test_flush_is_refused_while_requests_are_in_flight():
    s, _ = make_scheduler()
    submit(s, "r", PROMPT, max_new_tokens=20)
    s.step()
    assert not s.flush_cache().success
    run_to_end(s)
    assert s.flush_cache().success and s.cache.evictable_size() == 0
    assert s.kv_pool.available_size() == s.kv_pool.size


def test_paged_cache_matches_whole_pages():
    s, runner = make_scheduler(page_size=4)
    submit(s, "first", PROMPT[:30], max_new_tokens=3)
    run_to_end(s)
    submit(s, "second", [*PROMPT[:30], 1, 1], max_new_tokens=3)
    out = run_to_end(s)
    assert runner.batches[-3].prefix_lens == [28]  # 30 shared tokens -> 7 whole pages
    assert out["second"][0] == reference_output([*PROMPT[:30], 1, 1], 3)


def test_internal_state_is_a_snapshot_of_the_counters():
    """The scheduler counts into its own counters; a state it returned keeps its values."""
    s, _ = make_scheduler()
    submit(s, "a", PROMPT[:20], max_new_tokens=4)
    s.step()
    before = s.internal_state()
    run_to_end(s)
    assert before.counters.generated_tokens == 1
    assert s.internal_state().counters.generated_tokens == 4
    assert before.counters is not s.stats


def test_requests_on_one_cached_prefix_run_next_to_each_other():
    """Admission puts a request next to the running ones on its cached prefix (the native
    attention reads a key block that consecutive requests share once for all of them), not at
    the end of the running set; outputs are unchanged."""
    s, runner = make_scheduler()
    prefix_a, prefix_b = PROMPT, [9 - t for t in PROMPT]
    submit(s, "a0", prefix_a, max_new_tokens=2)
    submit(s, "b0", prefix_b, max_new_tokens=2)
    run_to_end(s)
    prompts = {}
    for i, (name, prefix) in enumerate([("a1", prefix_a), ("b1", prefix_b), ("a2", prefix_a),
                                        ("b2", prefix_b), ("c", [1, 2, 3])]):  # fmt: skip
        prompts[name] = [*prefix, i + 1, i + 2]
        submit(s, name, prompts[name], max_new_tokens=6)
    s.step()
    assert [r.rid for r in s.running] == ["a1", "a2", "b1", "b2", "c"]
    assert s.running[0].prefix_first_slot == s.running[1].prefix_first_slot >= 0
    assert s.running[4].prefix_first_slot == -1
    s.step()
    assert runner.batches[-1].batch_size == 5
    out = run_to_end(s)
    for name, prompt in prompts.items():
        assert out[name][0] == reference_output(prompt, 6), name


def test_a_request_goes_next_to_the_running_one_that_computed_its_prefix():
    """The request that prefilled a prefix had nothing cached at admission; a later request on
    that prefix still joins it (its first slot is read once its KV exists)."""
    s, _ = make_scheduler()
    owner, other, follower = PROMPT, [9 - t for t in PROMPT], [*PROMPT, 4, 4]
    submit(s, "owner", owner, max_new_tokens=12)
    s.step()
    submit(s, "other", other, max_new_tokens=8)
    s.step()
    submit(s, "follower", follower, max_new_tokens=4)
    s.step()
    assert [r.rid for r in s.running] == ["owner", "follower", "other"]
    out = run_to_end(s)
    for name, prompt, n in (("owner", owner, 12), ("other", other, 8), ("follower", follower, 4)):
        assert out[name][0] == reference_output(prompt, n), name
