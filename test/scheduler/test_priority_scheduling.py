"""Priority scheduling: the waiting queue's order by rank, the preemption decision, and
preemption on a Scheduler with the toy runner (outputs must stay exact through a retraction)."""

from __future__ import annotations

import time

from toy_runner import make_scheduler, reference_output, run_to_end

from radixgen.io_struct import TokenizedGenerateReq
from radixgen.runtime.scheduler.background_budget import (
    INTERACTIVE_WINDOW_S,
    MIN_BACKGROUND_TOKENS,
    BackgroundBudget,
)
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.schedule_policy import (
    order_waiting_queue,
    outranks,
    preemption_victim,
    priority_rank,
)
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.sampling_params import SamplingParams

PROMPT = list(range(1, 25))


def _msg(
    rid: str, prompt: list[int], priority: int, background: bool, n: int
) -> TokenizedGenerateReq:
    sp = SamplingParams.from_dict({"max_new_tokens": n, "temperature": 0})
    return TokenizedGenerateReq(
        rid, list(prompt), sp, arrival_time=time.time(), priority=priority, background=background
    )


def _req(rid: str, priority: int = 0, background: bool = False, t: float = 0.0) -> Req:
    req = Req(_msg(rid, [1, 2, 3], priority, background, 4), 0)
    req.arrival_time = t
    return req


def _submit(
    s: Scheduler, rid: str, prompt: list[int], priority: int = 0, background: bool = False,
    n: int = 8,
) -> None:  # fmt: skip
    s.add_request(_msg(rid, prompt, priority, background, n))


# --- queue order -------------------------------------------------------------------------------


def test_queue_orders_by_priority_then_arrival_and_batch_lines_last():
    reqs = [
        _req("batch-high", priority=100, background=True, t=0),
        _req("low", priority=1, t=1),
        _req("high-late", priority=5, t=3),
        _req("high", priority=5, t=2),
        _req("none", t=4),
    ]
    for r in reqs:  # the rank the scheduler derives (larger values first)
        r.rank = priority_rank(r.priority, r.background, low_values_first=False)
    s, _ = make_scheduler()
    order = [r.rid for r in order_waiting_queue(reqs, "fcfs", s.cache)]
    assert order == ["high", "high-late", "low", "none", "batch-high"]


def test_low_values_first_reverses_the_direction_but_not_the_batch_tier():
    reqs = [_req("a", 5, t=0), _req("b", -3, t=1), _req("c", 0, background=True, t=2)]
    for r in reqs:
        r.rank = priority_rank(r.priority, r.background, low_values_first=True)
    s, _ = make_scheduler()
    assert [r.rid for r in order_waiting_queue(reqs, "lpm", s.cache)] == ["b", "a", "c"]


def test_retracted_requests_go_first_within_their_level_only():
    a, b, c = _req("a", 1, t=0), _req("b", 1, t=1), _req("c", 9, t=2)
    b.retractions = 1
    s, _ = make_scheduler()
    assert [r.rid for r in order_waiting_queue([a, b, c], "fcfs", s.cache)] == ["c", "b", "a"]


# --- the preemption decision --------------------------------------------------------------------


def test_outranks_needs_a_gap_above_the_threshold_within_a_tier():
    hi, lo = priority_rank(20, False, False), priority_rank(10, False, False)
    assert not outranks(hi, lo, threshold=10, by_priority=True)  # gap 10 is not above 10
    assert outranks(priority_rank(21, False, False), lo, threshold=10, by_priority=True)
    assert not outranks(priority_rank(99, False, False), lo, threshold=0, by_priority=False)
    assert not outranks(lo, hi, threshold=0, by_priority=True)


def test_an_interactive_request_outranks_any_batch_line_even_without_priorities():
    batch = priority_rank(1000, True, False)
    assert outranks(priority_rank(-5, False, False), batch, threshold=10, by_priority=False)
    assert not outranks(batch, priority_rank(-5, False, False), threshold=0, by_priority=True)


def test_the_victim_is_the_lowest_ranked_then_the_newest():
    cand = _req("c", priority=50)
    running = [_req("p0-old", 0, t=0), _req("p0-new", 0, t=5), _req("p30", 30, t=9)]
    victim = preemption_victim(cand, running, threshold=10, by_priority=True)
    assert victim is not None and victim.rid == "p0-new"
    assert preemption_victim(cand, running[2:], threshold=10, by_priority=True) is not None
    assert preemption_victim(cand, running[2:], threshold=30, by_priority=True) is None


# --- on a Scheduler ----------------------------------------------------------------------------


def _preempt_run(**flags: object) -> tuple[Scheduler, dict[str, tuple[list[int], object]]]:
    """One running slot; "low" is decoding when "high" (priority 100) arrives."""
    s, _ = make_scheduler(max_running_requests=1, **flags)
    _submit(s, "low", [7, *PROMPT], priority=0, n=12)
    s.step()
    s.step()
    _submit(s, "high", PROMPT, priority=100, n=4)
    s.step()
    running = [r.rid for r in s.running]
    out = run_to_end(s)
    out["_running_after_arrival"] = (running, None)
    return s, out


def test_a_high_priority_request_preempts_a_low_one_and_both_outputs_stay_exact():
    s, out = _preempt_run(enable_priority_scheduling=True)
    assert out["_running_after_arrival"][0] == ["high"]
    assert s.stats.retractions == 1
    assert out["high"][0] == reference_output(PROMPT, 4)
    assert out["low"][0] == reference_output([7, *PROMPT], 12)  # resumed after its retraction


def test_no_preemption_below_the_threshold_or_when_disabled_or_priorities_off():
    for flags in (
        {"enable_priority_scheduling": True, "priority_scheduling_preemption_threshold": 100},
        {"enable_priority_scheduling": True, "disable_priority_preemption": True},
        {},  # priorities off: both are interactive requests of equal rank
    ):
        s, out = _preempt_run(**flags)
        assert out["_running_after_arrival"][0] == ["low"], flags
        assert s.stats.retractions == 0
        assert out["high"][0] == reference_output(PROMPT, 4)


def test_a_waiting_high_priority_request_is_admitted_before_earlier_low_ones():
    s, _ = make_scheduler(max_running_requests=1, enable_priority_scheduling=True)
    _submit(s, "first", [5, *PROMPT], priority=0, n=3)
    s.step()
    for i in range(3):
        _submit(s, f"low{i}", [i + 10, *PROMPT], priority=0, n=3)
    _submit(s, "high", [9, *PROMPT], priority=5, n=3)  # gap 5 < threshold 10: no preemption
    admitted: list[str] = []
    while s.has_work:
        s.step()
        for r in s.running:
            if r.rid not in admitted:
                admitted.append(r.rid)
    assert admitted == ["first", "high", "low0", "low1", "low2"]


def test_an_interactive_request_preempts_a_batch_line_with_priorities_off():
    for overlap in (False, True):
        s, _ = make_scheduler(max_running_requests=1, enable_overlap_schedule=overlap)
        _submit(s, "line", [7, *PROMPT], background=True, n=12)
        s.step()
        s.step()
        _submit(s, "chat", PROMPT, priority=0, n=4)
        s.step()
        assert [r.rid for r in s.running] == ["chat"], overlap
        out = run_to_end(s)
        assert out["chat"][0] == reference_output(PROMPT, 4)
        assert out["line"][0] == reference_output([7, *PROMPT], 12)


def test_preemption_frees_the_pool_for_a_blocked_interactive_request():
    # the batch line's KV fills most of the pool: the interactive prompt cannot fit beside it
    s, _ = make_scheduler(pool_tokens=96, max_running_requests=4)
    long_prompt = list(range(1, 61))
    _submit(s, "line", long_prompt, background=True, n=20)
    s.step()
    s.step()
    chat = [40 + i % 9 for i in range(50)]
    _submit(s, "chat", chat, n=4)
    s.step()
    assert "chat" in [r.rid for r in s.running]
    assert "line" not in [r.rid for r in s.running]
    out = run_to_end(s)
    assert out["chat"][0] == reference_output(chat, 4)
    assert out["line"][0] == reference_output(long_prompt, 20)


def test_no_preemption_where_it_would_not_admit_the_waiting_request():
    # an interactive request holds most of the pool: retracting the small batch line could not
    # make room for "chat", so the line keeps running
    s, _ = make_scheduler(pool_tokens=96, max_running_requests=4)
    _submit(s, "other", [3, *range(1, 40)], n=6)
    _submit(s, "line", [5, *range(1, 20)], background=True, n=6)
    s.step()
    s.step()
    chat = [40 + i % 9 for i in range(60)]
    _submit(s, "chat", chat, n=4)
    s.step()
    assert s.stats.retractions == 0 and {r.rid for r in s.running} == {"other", "line"}
    out = run_to_end(s)
    assert out["chat"][0] == reference_output(chat, 4)


def test_a_batch_lines_next_prefill_chunk_waits_for_a_waiting_interactive_request():
    s, runner = make_scheduler(chunked_prefill_size=16)
    long_prompt = [3 + i % 40 for i in range(64)]
    _submit(s, "line", long_prompt, background=True, n=3)
    s.step()  # the line's first chunk
    _submit(s, "chat", PROMPT, n=3)
    s.step()
    assert runner.batches[-1].extend_lens == [16]  # the chat's chunk, not the line's second
    assert [r.rid for r in s.running] == ["line", "chat"]
    out = run_to_end(s)
    assert out["line"][0] == reference_output(long_prompt, 3)
    assert out["chat"][0] == reference_output(PROMPT, 3)


def test_preemption_counts_the_reservation_admission_keeps_for_future_tokens():
    # "chat" fits the free pool on its own, not beside the slots reserved for the line's 170
    # future tokens: admission would refuse it, so the line is preempted
    s, _ = make_scheduler(pool_tokens=200)
    _submit(s, "line", [5, *range(1, 20)], background=True, n=170)
    s.step()
    s.step()
    chat = [40 + i % 9 for i in range(60)]
    _submit(s, "chat", chat, n=4)
    s.step()
    assert [r.rid for r in s.running] == ["chat"] and s.stats.retractions == 1
    out = run_to_end(s)
    assert out["chat"][0] == reference_output(chat, 4)
    assert out["line"][0] == reference_output([5, *range(1, 20)], 170)


def test_a_step_that_prefills_an_interactive_request_admits_no_batch_line():
    s, runner = make_scheduler()
    _submit(s, "line0", [3, *PROMPT], background=True, n=6)
    s.step()
    _submit(s, "line1", [4, *PROMPT], background=True, n=3)
    _submit(s, "chat", [5, *PROMPT], n=3)
    s.step()
    assert runner.batches[-1].extend_lens == [25]  # the chat's prompt alone: line0's decode waits
    s.step()
    assert "line1" in [r.rid for r in s.running]  # the next step takes the line
    out = run_to_end(s)
    assert out["line1"][0] == reference_output([4, *PROMPT], 3)


def test_an_interactive_request_whose_prompt_is_cached_gets_its_first_token_alone():
    # its whole prompt is in the tree, so its first step runs one token: still its time to
    # first token, so the lines' decodes wait one step (a later decode of it does not do that)
    s, runner = make_scheduler()
    chat = [6, *PROMPT]
    _submit(s, "warm", chat, n=1)
    run_to_end(s)
    _submit(s, "line0", [3, *PROMPT], background=True, n=6)
    _submit(s, "line1", [4, *PROMPT], background=True, n=6)
    s.step()
    s.step()  # the lines decode
    _submit(s, "chat", chat, n=3)
    s.step()
    assert runner.batches[-1].extend_lens == [1]  # the chat's last prompt token, alone
    s.step()
    assert sorted(runner.batches[-1].extend_lens) == [1, 1, 1]  # its decode beside the lines'
    out = run_to_end(s)
    assert out["chat"][0] == reference_output(chat, 3)
    assert out["line0"][0] == reference_output([3, *PROMPT], 6)


def test_batch_prefill_is_cut_to_the_step_target_only_while_interactive_traffic_is_about():
    s, runner = make_scheduler(chunked_prefill_size=64, background_step_ms=100.0)
    long_prompt = [3 + i % 40 for i in range(200)]
    _submit(s, "line0", long_prompt, background=True, n=2)
    s.background_budget.seconds_per_token = 0.1 / 40  # 40 tokens fit in 100 ms
    s.step()
    assert runner.batches[-1].extend_lens == [64]  # a batch alone: full chunks
    s.background_budget.interactive_arrived(time.monotonic())  # a chat arrived just now
    s.background_budget.seconds_per_token = 0.1 / 40
    s.step()
    assert runner.batches[-1].extend_lens == [40]  # cut to what 100 ms holds
    s.background_budget.last_interactive = time.monotonic() - INTERACTIVE_WINDOW_S - 1
    s.background_budget.seconds_per_token = 0.1 / 40
    s.step()
    assert runner.batches[-1].extend_lens == [64]  # the window has passed
    out = run_to_end(s)
    assert out["line0"][0] == reference_output(long_prompt, 2)


def test_background_budget_measures_the_step_rate_and_keeps_a_floor():
    b = BackgroundBudget(target_ms=100.0)
    b.interactive_arrived(time.monotonic())
    assert b.tokens(0, False, time.monotonic()) is None  # nothing measured yet: no cut
    b.observe_step(8, 1.0)  # too small a step to measure
    assert b.seconds_per_token is None
    b.observe_step(100, 0.2)
    assert b.tokens(10, False, time.monotonic()) == 50 - 10
    assert b.tokens(10, False, time.monotonic() + INTERACTIVE_WINDOW_S + 1) is None
    assert b.tokens(10, True, time.monotonic() + INTERACTIVE_WINDOW_S + 1) == 40  # one running
    b.observe_step(100, 2.0)  # slower steps lower the budget, down to the floor
    assert b.tokens(45, True, time.monotonic()) == MIN_BACKGROUND_TOKENS
    assert BackgroundBudget(target_ms=0).tokens(0, True, time.monotonic()) is None
