"""Overlap scheduling (step N+1 planned and launched before step N's tokens are handled) gives
the same outputs as the synchronous scheduler, on real pools and the radix cache with the toy
runner, whose outputs break if a pending token were read wrongly or a KV slot lost or shared.

`debug_invariants` (on in `make_scheduler`) checks the KV accounting after every step, with a
step in flight too.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from step_helpers import count_steps_in_flight
from toy_runner import make_scheduler, reference_output, submit

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import AbortReq, TokenizedGenerateReq, apply_delta
from radixgen.runtime.constrained.grammar_manager import JumpForwardEdit
from radixgen.runtime.scheduler.scheduler import Scheduler, overlap_enabled
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import ServerArgs

PROMPT = [7, 3, 9, 4, 1, 8, 2, 6] * 8  # 64 tokens


def run_collecting(s: Scheduler, max_steps: int = 10_000) -> dict[str, Any]:
    """Step until idle: per rid, the streamed token ids and the finish reason."""
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, Any] = {}
    for _ in range(max_steps):
        if not (s.has_work or s.grammar_waiting):
            return {rid: (tokens.get(rid, []), reasons.get(rid)) for rid in reasons}
        for batch in s.step():
            for d in batch.deltas:
                rid = d.rid
                assert rid not in reasons, f"{rid}: a message after its final one"
                assert all(t >= 0 for t in d.new_token_ids), "a pending token escaped"
                apply_delta(tokens.setdefault(rid, []), d)
                if d.finished_reason is not None:
                    reasons[rid] = d.finished_reason
    raise AssertionError("the scheduler did not go idle")


WORKLOADS: dict[str, tuple[dict[str, Any], list[tuple[str, list[int], dict[str, Any]]]]] = {
    "decode-lengths": (
        {},
        [(f"r{i}", [i + 1, *PROMPT[i:]], {"max_new_tokens": n}) for i, n in enumerate((0, 1, 2, 9, 20))],
    ),
    "chunked-shared-prefix": (
        {"chunked_prefill_size": 16},
        [(f"r{i}", [*PROMPT, *PROMPT[: 3 + i]], {"max_new_tokens": 7 + i}) for i in range(4)],
    ),
    "retraction": (
        {"pool_tokens": 160},
        [(f"r{i}", [i + 1, *PROMPT[: 20 + i]], {"max_new_tokens": 40}) for i in range(4)],
    ),
    "pages": (
        {"page_size": 4},
        [(f"r{i}", [*PROMPT[: 13 + i]], {"max_new_tokens": 11}) for i in range(3)],
    ),
    "stops-and-streams": (
        {"stream_interval": 2},
        [
            ("tok", PROMPT, {"max_new_tokens": 12, "stop_token_ids": [reference_output(PROMPT, 12)[4]]}),
            ("str", PROMPT[:40], {"max_new_tokens": 12, "stop": ["zz", "ab"]}),
            ("long", PROMPT[:9], {"max_new_tokens": 30, "stream": True}),
        ],
    ),
}  # fmt: skip


def _run(workload: str, overlap: bool) -> tuple[dict[str, Any], Scheduler]:
    flags, reqs = WORKLOADS[workload]
    flags = dict(flags)
    pool = flags.pop("pool_tokens", 2048)
    s, _ = make_scheduler(pool_tokens=pool, enable_overlap_schedule=overlap, **flags)
    assert s.overlap is overlap
    for rid, prompt, params in reqs:
        submit(s, rid, prompt, **params)
    return run_collecting(s), s


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_outputs_equal_the_synchronous_scheduler(workload: str):
    sync, s_sync = _run(workload, overlap=False)
    over, s = _run(workload, overlap=True)
    assert over == sync
    assert s.stats.generated_tokens == s_sync.stats.generated_tokens  # none taken twice
    for rid, prompt, params in WORKLOADS[workload][1]:
        n = params["max_new_tokens"]
        ids = over[rid][0]
        assert ids == reference_output(prompt, n)[: len(ids)]
    if workload == "retraction":
        assert s.stats.retractions > 0
    assert not s.running and s.inflight is None and s.cache.protected_size() == 0
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


class ForcingGrammar:
    """A toy grammar over the toy vocabulary: multiples of 5 are forbidden; after a multiple of 3
    it forces two more tokens (jump-forward appends them), after a multiple of 7 it re-tokenizes
    its last two tokens into one (jump-forward replaces the tail); it ends after `end` tokens."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.tokens: list[int] = []

    def allowed(self, t: int) -> bool:
        return t % 5 != 0

    def accept_token(self, t: int) -> bool:
        self.tokens.append(t)
        return self.allowed(t)

    def is_terminated(self) -> bool:
        return len(self.tokens) >= self.end

    def forced(self) -> JumpForwardEdit | None:
        if self.is_terminated() or not self.tokens:
            return None
        last, n = self.tokens[-1], len(self.tokens)
        if last % 3 == 0:
            new = [last % 47 + 1, (last + 1) % 47 + 1]
            new = [t + 1 if t % 5 == 0 else t for t in new]
            self.tokens += new
            return JumpForwardEdit(n, new, 2)
        if last % 7 == 0 and n >= 2:
            merged = (self.tokens[-2] + last) % 46 + 1
            merged += merged % 5 == 0
            self.tokens[-2:] = [merged]
            return JumpForwardEdit(n - 2, [merged], 0)
        return None


class ForcingGrammars:
    """Stands in for the GrammarManager with `ForcingGrammar`s (the one on `r.grammar`)."""

    bitmask_words = 2

    def __init__(self, end: int) -> None:
        self.end = end

    def submit(self, req) -> None:
        pass

    def poll(self, reqs):
        for r in reqs:
            r.grammar = ForcingGrammar(self.end + len(r.rid))
        return list(reqs), []

    def fill_mask(self, reqs):
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        bits = torch.tensor([[t % 5 != 0 for t in range(64)]]).view(2, 32).long()
        words = (bits << torch.arange(32)).sum(dim=1)
        words = (words - (words >= 2**31) * 2**32).to(torch.int32)
        return words.repeat(len(rows), 1), torch.tensor(rows, dtype=torch.long)

    def accept(self, req, token_id: int) -> None:
        assert req.grammar.accept_token(token_id), token_id

    def jump_forward(self, req, max_output_len: int):
        return req.grammar.forced()

    def stats(self) -> dict[str, float]:
        return {}


@pytest.mark.parametrize("page_size", [1, 4])
def test_constrained_requests_overlap_and_give_the_synchronous_outputs(page_size: int):
    # masks must see the previous step's tokens, and a jump-forward (appended or replaced tail)
    # must drop the token the next step already ran for that request
    outs = {}
    for overlap in (False, True):
        s, _ = make_scheduler(
            grammars=ForcingGrammars(18), enable_overlap_schedule=overlap, page_size=page_size
        )
        for i in range(5):
            submit(s, f"g{i}", [i + 1, *PROMPT[: 9 + 3 * i]], max_new_tokens=40, regex="x")
        submit(s, "free", PROMPT[:20], max_new_tokens=25)
        steps_in_flight = count_steps_in_flight(s)
        outs[overlap] = run_collecting(s)
        assert len(outs[overlap]) == 6
        if overlap:
            assert sum(steps_in_flight) > 20  # the constrained steps did overlap
        assert s.stats.jump_forward_tokens > 0
        assert not s.running and s.inflight is None and s.cache.protected_size() == 0
        assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size
    assert outs[True] == outs[False]


def test_the_next_step_is_launched_before_the_tokens_of_this_one_arrive():
    s, runner = make_scheduler(enable_overlap_schedule=True)
    submit(s, "r", PROMPT[:8], max_new_tokens=6)
    s.step()  # prefill, sampled on the device
    req = s.running[0]
    assert req.pending_sample and req.output_ids == [] and s.inflight is not None
    s.step()  # the first decode launches, then the first token is handled
    assert runner.batches[-1].input_ids.tolist() == reference_output(PROMPT[:8], 1)
    assert req.output_ids == reference_output(PROMPT[:8], 1) and req.pending_sample
    assert len(runner.batches) == 2


def test_a_request_finishing_by_length_runs_no_extra_step():
    """Its last token is known to end it, so no step is launched for it while it is in flight."""
    rows = {}
    for overlap in (False, True):
        s, runner = make_scheduler(enable_overlap_schedule=overlap)
        submit(s, "a", PROMPT[:8], max_new_tokens=3)
        submit(s, "b", PROMPT[:12], max_new_tokens=5)
        run_collecting(s)
        rows[overlap] = sum(len(b.extend_lens) for b in runner.batches)
    assert rows[True] == rows[False]


def test_abort_while_a_token_is_in_flight():
    s, _ = make_scheduler(enable_overlap_schedule=True)
    submit(s, "gone", PROMPT, max_new_tokens=50)
    submit(s, "kept", PROMPT[:20], max_new_tokens=10)
    for _ in range(4):
        s.step()
    assert any(r.pending_sample for r in s.running)
    s.handle(AbortReq(rid="gone"))
    out = run_collecting(s)
    assert out["gone"][1] == FinishReason.abort("aborted by the client", 499)
    assert out["kept"] == (reference_output(PROMPT[:20], 10), FinishReason.length(10))
    assert not s.running and s.cache.protected_size() == 0
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


def test_logprobs_arrive_with_their_tokens():
    s, _ = make_scheduler(enable_overlap_schedule=True)
    sp = SamplingParams.from_dict({"max_new_tokens": 6, "temperature": 0})
    s.add_request(
        TokenizedGenerateReq("r", PROMPT[:8], sp, return_logprob=True, top_logprobs_num=2,
                             stream=True, arrival_time=time.time())
    )  # fmt: skip
    entries, tokens = [], []
    while s.has_work:
        for batch in s.step():
            tokens += batch.deltas[0].new_token_ids
            entries += batch.deltas[0].output_token_logprobs
    assert tokens == reference_output(PROMPT[:8], 6)
    assert [tid for _, tid in entries] == tokens


def test_overlap_is_on_by_default_on_cuda_only():
    args = ServerArgs.from_kwargs()
    assert not overlap_enabled(args, "cpu") and overlap_enabled(args, "cuda")
    assert overlap_enabled(ServerArgs.from_kwargs(enable_overlap_schedule=True), "cpu")
    off = ServerArgs.from_kwargs(disable_overlap_schedule=True, enable_overlap_schedule=True)
    assert not overlap_enabled(off, "cuda") and not overlap_enabled(off, "cpu")


def test_the_scheduler_accounts_for_its_step_time():
    """step_seconds covers the forwards and the waits for sampled tokens (the bench's host
    share of a step is read from these)."""
    for overlap in (False, True):
        s, _ = make_scheduler(enable_overlap_schedule=overlap)
        submit(s, "r", PROMPT[:8], max_new_tokens=12)
        run_collecting(s)
        st = s.stats
        assert st.step_seconds > 0 and st.forward_seconds > 0 and st.device_wait_seconds >= 0
        assert st.forward_seconds + st.device_wait_seconds <= st.step_seconds
        assert s.internal_state().counters.step_seconds == st.step_seconds
