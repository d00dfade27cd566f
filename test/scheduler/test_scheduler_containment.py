"""Containment: a bug reached while handling one request fails that request only, with a 500.

Faults are injected through the scheduler's real seams (the model runner, the prefix cache, the
grammar manager, one request's grammar object), never into the scheduler itself. After every
step `debug_invariants` checks the KV accounting; at the end every slot must be free or
evictable and no cache node locked, and the other requests' outputs must equal the reference.
"""

from __future__ import annotations

import torch
from toy_runner import ToyRunner, make_scheduler, reference_output, run_to_end, submit

from radixgen.runtime.scheduler.scheduler import Scheduler

PROMPT = [7, 3, 9, 4, 1, 8, 2, 6] * 4  # 32 tokens
OTHER = [5, 1, 4, 1, 5, 9, 2, 6] * 4


class Boom(RuntimeError):
    pass


def assert_all_free(s: Scheduler) -> None:
    assert not s.running and not s.waiting and not s.grammar_waiting
    assert s.cache.protected_size() == 0
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


def assert_internal_error(reason: object) -> None:
    assert getattr(reason, "kind", None) == "abort" and reason.status_code == 500, reason
    assert "Boom" in reason.message


class _Grammar:
    """A grammar object allowing every token; `accept_token` raises once armed."""

    def __init__(self, fail_at: int | None) -> None:
        self.fail_at = fail_at
        self.accepted = 0

    def is_terminated(self) -> bool:
        return False

    def accept_token(self, token_id: int) -> bool:
        self.accepted += 1
        if self.fail_at is not None and self.accepted >= self.fail_at:
            raise Boom("accept_token")
        return True


class FaultyGrammars:
    """Stands in for the GrammarManager: compiles at once; `poll` raises whenever a request in
    `poll_fails` is among those polled; `accept_fails` rids get a grammar that raises."""

    def __init__(self, poll_fails: set[str] = frozenset(), accept_fails: set[str] = frozenset()):
        self.poll_fails = poll_fails
        self.accept_fails = accept_fails

    def submit(self, req) -> None:
        pass

    def poll(self, reqs):
        if any(r.rid in self.poll_fails for r in reqs):
            raise Boom("poll")
        for r in reqs:
            r.grammar = _Grammar(3 if r.rid in self.accept_fails else None)
        return list(reqs), []

    def fill_mask(self, reqs):
        return torch.empty((0, 1), dtype=torch.int32), torch.empty(0, dtype=torch.long)

    def accept(self, req, token_id: int) -> None:
        req.grammar.accept_token(token_id)

    def jump_forward(self, req, max_output_len: int):
        return None

    def stats(self) -> dict[str, float]:
        return {}


def test_grammar_poll_failure_fails_only_that_request():
    s, _ = make_scheduler(grammars=FaultyGrammars(poll_fails={"bad"}))
    submit(s, "bad", PROMPT, max_new_tokens=6, regex="x")
    submit(s, "good", OTHER, max_new_tokens=6, regex="x")
    submit(s, "plain", PROMPT, max_new_tokens=6)
    out = run_to_end(s)
    assert_internal_error(out["bad"][1])
    assert out["good"][0] == reference_output(OTHER, 6)
    assert out["plain"][0] == reference_output(PROMPT, 6)
    assert_all_free(s)


def test_a_grammar_that_raises_on_accept_fails_its_request_and_frees_its_kv():
    s, _ = make_scheduler(grammars=FaultyGrammars(accept_fails={"bad"}))
    submit(s, "bad", PROMPT, max_new_tokens=10, regex="x")
    submit(s, "good", OTHER, max_new_tokens=10, regex="x")
    out = run_to_end(s)
    ids, reason = out["bad"]
    assert_internal_error(reason)
    assert ids == reference_output(PROMPT, 10)[:3]  # what it had when it broke
    assert out["good"][0] == reference_output(OTHER, 10)
    assert_all_free(s)


class FaultyRunner(ToyRunner):
    """The toy model, failing every forward that contains a sequence starting with `poison`."""

    poison = 99

    def forward(self, batch):
        if self.poison in batch.input_ids.tolist():
            raise Boom("forward")
        return super().forward(batch)


def test_a_failing_forward_fails_that_batch_only_and_the_loop_serves_on():
    s, runner = make_scheduler(max_running_requests=1)
    s.model_runner = FaultyRunner(runner.kv_pool, runner.req_to_token_pool)
    submit(s, "bad", [FaultyRunner.poison, *PROMPT], max_new_tokens=4)
    submit(s, "later", OTHER, max_new_tokens=4)  # waits: max_running_requests=1
    out = run_to_end(s)
    assert_internal_error(out["bad"][1])
    assert out["later"][0] == reference_output(OTHER, 4)
    assert_all_free(s)


def test_a_planning_failure_fails_the_request_being_admitted_only():
    s, _ = make_scheduler()
    real_match = s.cache.match_prefix

    def match_prefix(key, namespace=None):  # the radix cache, broken for one request's prompt
        if key[:1] == [FaultyRunner.poison]:
            raise Boom("match_prefix")
        return real_match(key, namespace)

    s.cache.match_prefix = match_prefix
    submit(s, "good", PROMPT, max_new_tokens=5)
    submit(s, "bad", [FaultyRunner.poison, *OTHER], max_new_tokens=5)
    submit(s, "other", OTHER, max_new_tokens=5)
    out = run_to_end(s)
    assert_internal_error(out["bad"][1])
    assert out["good"][0] == reference_output(PROMPT, 5)
    assert out["other"][0] == reference_output(OTHER, 5)
    assert_all_free(s)


def test_a_request_whose_output_cannot_be_built_fails_and_the_others_are_sent():
    s, _ = make_scheduler()
    submit(s, "good", PROMPT, max_new_tokens=5, stream=True)
    submit(s, "bad", OTHER, max_new_tokens=5, stream=True)
    s.step()  # both admitted and prefilled

    def broken_meta():
        raise Boom("meta")

    bad = next(r for r in s.running if r.rid == "bad")
    bad.meta = broken_meta
    out = run_to_end(s)
    assert_internal_error(out["bad"][1])
    assert out["good"][0] == reference_output(PROMPT, 5)[1:]  # the first token went out above
    assert_all_free(s)


def test_the_last_resort_fails_every_request_held_and_the_scheduler_serves_on():
    s, _ = make_scheduler(max_running_requests=1)
    submit(s, "running", PROMPT, max_new_tokens=20)
    submit(s, "waiting", OTHER, max_new_tokens=20)
    s.step()
    outputs = s.fail_all(Boom("step"))
    assert sorted(d.rid for b in outputs for d in b.deltas) == ["running", "waiting"]
    for b in outputs:
        assert_internal_error(b.deltas[0].finished_reason)
    assert_all_free(s)
    s.check_invariants()
    submit(s, "after", OTHER, max_new_tokens=4)
    assert run_to_end(s)["after"][0] == reference_output(OTHER, 4)
