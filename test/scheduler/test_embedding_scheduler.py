"""The embedding scheduler on its own, with a fake runner: one batch per step within the token
budget in arrival order, refusals answered as 400s, aborts, and a failing step contained to
its requests (500s) while the next step serves on."""

from __future__ import annotations

import torch

from radixgen.internal_state import EmbeddingSchedulerState
from radixgen.io_struct import (
    AbortReq,
    EmbeddingFailure,
    EmbeddingVector,
    FlushCacheOut,
    FlushCacheReq,
    GetInternalStateOut,
    GetInternalStateReq,
    TokenizedEmbeddingReq,
)
from radixgen.runtime.model_executor.embedding_runner import EmbeddingJob
from radixgen.runtime.scheduler.embedding_scheduler import EmbeddingScheduler


class FakeRunner:
    """Embeds a sequence as [its length, its first id]; records each batch it was given."""

    max_input_tokens = 8
    hidden_size = 2
    fail_next = False
    cached_tokens = 0
    last_cached_tokens: list[int] = []  # noqa: RUF012 - never written

    def flush_cache(self) -> int:
        return 0

    def __init__(self) -> None:
        self.batches: list[list[EmbeddingJob]] = []

    def embed(self, jobs: list[EmbeddingJob]) -> list[torch.Tensor]:
        self.batches.append(jobs)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return [torch.tensor([float(len(j.input_ids)), float(j.input_ids[0])]) for j in jobs]


def _req(rid: str, n: int, dims: int | None = None) -> TokenizedEmbeddingReq:
    return TokenizedEmbeddingReq(rid, list(range(1, n + 1)), dims)


def _scheduler(budget: int) -> tuple[EmbeddingScheduler, FakeRunner]:
    runner = FakeRunner()
    return EmbeddingScheduler(runner, budget), runner  # type: ignore[arg-type]


def test_one_batch_per_step_within_the_token_budget_in_arrival_order() -> None:
    sched, runner = _scheduler(budget=12)
    for rid, n in [("a", 5), ("b", 4), ("c", 6), ("d", 1)]:
        sched.handle(_req(rid, n))
    first = sched.step()
    assert [out.rids for out in first] == [["a", "b"]]  # 5 + 4; c's 6 more would pass 12
    assert first[0].outputs == [
        EmbeddingVector("a", 5, [5.0, 1.0]),
        EmbeddingVector("b", 4, [4.0, 1.0]),
    ]
    second = sched.step()
    assert second[0].rids == ["c", "d"]
    assert not sched.has_work and sched.step() == []
    assert [len(b) for b in runner.batches] == [2, 2]


def test_a_budget_below_the_model_limit_still_takes_the_longest_input() -> None:
    sched, _ = _scheduler(budget=2)
    sched.handle(_req("a", 8))
    assert sched.step()[0].rids == ["a"]


def test_refusals_are_400s_without_a_forward() -> None:
    sched, runner = _scheduler(budget=100)
    sched.handle(_req("long", 9))
    sched.handle(TokenizedEmbeddingReq("empty", []))
    sched.handle(_req("wide", 3, dims=3))
    sched.handle(_req("ok", 3, dims=1))
    out = sched.step()[0]
    answers = {o.rid: o for o in out.outputs}
    long_input = "the input has 9 tokens; this model takes at most 8"
    assert answers["long"] == EmbeddingFailure("long", 9, long_input, 400)
    assert isinstance(answers["empty"], EmbeddingFailure) and answers["empty"].status == 400
    wide = answers["wide"]
    assert isinstance(wide, EmbeddingFailure) and "dimensions" in wide.message
    assert isinstance(answers["ok"], EmbeddingVector)
    assert [len(b) for b in runner.batches] == [1]


def test_aborts_drop_waiting_requests() -> None:
    sched, _ = _scheduler(budget=100)
    for rid in "abc":
        sched.handle(_req(rid, 2))
    sched.handle(AbortReq(rid="b"))
    assert sched.step()[0].rids == ["a", "c"]
    sched.handle(_req("d", 2))
    sched.handle(AbortReq(abort_all=True))
    assert sched.step() == []


def test_a_failing_step_fails_its_requests_and_the_next_step_serves() -> None:
    sched, runner = _scheduler(budget=4)  # raised to the model's limit, 8: one input a step
    sched.handle(_req("a", 5))
    sched.handle(_req("b", 4))
    runner.fail_next = True
    out = sched.step()[0]
    (failed,) = out.outputs
    assert isinstance(failed, EmbeddingFailure) and failed.rid == "a" and failed.status == 500
    assert sched.step()[0].outputs == [EmbeddingVector("b", 4, [4.0, 1.0])]


def test_control_requests() -> None:
    sched, _ = _scheduler(budget=100)
    flushed = sched.handle(FlushCacheReq(request_id="f"))
    assert isinstance(flushed, FlushCacheOut) and flushed.success and flushed.request_id == "f"
    state = sched.handle(GetInternalStateReq(request_id="s"))
    assert isinstance(state, GetInternalStateOut)
    assert isinstance(state.state, EmbeddingSchedulerState)
    assert state.state.embedding_dim == 2 and state.state.waiting_requests == 0
