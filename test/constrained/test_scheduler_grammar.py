"""Constrained decoding end to end on the real default model, driving the in-process Scheduler.

All cases of a configuration run as one batch (add every request, then step until done), so the
whole matrix costs a few scheduler runs: xgrammar and outlines, jump-forward on and off, greedy
and seeded temperature 1.0. Every output that stops must satisfy its constraint (jsonschema,
re.fullmatch, choice membership, a parser for the EBNF cases).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest
from grammar_cases import ALL_CASES, Case
from step_helpers import count_steps_in_flight

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import TokenizedGenerateReq, apply_delta
from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend
from radixgen.runtime.constrained.grammar_manager import GrammarManager
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.scheduler.scheduler_process import build_scheduler
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import GrammarConfig, ServerArgs

pytestmark = pytest.mark.slow  # the real model decodes whole batches (minutes)

# Greedy outputs of bounded cases end well within this (the longest, without jump-forward, ~90).
GREEDY_MAX_NEW_TOKENS = 96
# A seeded temperature-1.0 sample may ramble inside a free string or number until its budget; it
# must still be a grammar-valid prefix, and only a few may end that way. A smaller budget keeps
# the batch's slow tail short.
SAMPLED_MAX_NEW_TOKENS = 64
# cases that need not end (any JSON object) may stop anywhere: give them less rope
UNBOUNDED_MAX_NEW_TOKENS = 48
MAX_LENGTH_SHARE_SAMPLED = 0.15
TEMPERATURES = (0.0, 1.0)
SEED = 7


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish: FinishReason
    jump_forward_tokens: int
    completion_tokens: int


class BatchResults(dict[str, Result]):
    """Results by rid, plus the grammar backend that produced them (to re-check prefixes)."""

    def __init__(self, backend: BaseGrammarBackend) -> None:
        super().__init__()
        self.backend = backend


@pytest.fixture(scope="module")
def scheduler(default_model_folder) -> Scheduler:
    args = ServerArgs.from_kwargs(
        dtype="bfloat16", max_total_tokens=24000, grammar_backend="xgrammar", debug_invariants=True
    )
    return build_scheduler(args, default_model_folder)


def run_batch(
    s: Scheduler, backend: str, jump_forward: bool, requests: list[tuple[str, list[int], dict]]
) -> BatchResults:
    """Run all requests as one batch under a fresh grammar manager; return results by rid.

    outlines runs without the per-request fallback: these tests are about outlines' own
    outputs and refusals (with it, what outlines refuses is served by xgrammar or llguidance).
    """
    config = GrammarConfig(
        grammar_backend=backend,
        disable_jump_forward=not jump_forward,
        disable_grammar_backend_fallback=backend == "outlines",
    )
    s.grammar_manager = GrammarManager(config, s.tokenizer, s.vocab_size, s.eos_token_ids)
    for rid, ids, params in requests:
        msg = TokenizedGenerateReq(
            rid, ids, SamplingParams.from_dict(params), arrival_time=time.time()
        )
        s.add_request(msg)
    tokens: dict[str, list[int]] = {}
    results = BatchResults(s.grammar_manager.backend)
    deadline = time.monotonic() + 300
    while s.has_work or s.grammar_waiting:  # has_work does not count compiling requests
        assert time.monotonic() < deadline, "constrained batch did not finish"
        for out in s.step():
            for d in out.deltas:
                toks = apply_delta(tokens.setdefault(d.rid, []), d)
                if d.finished_reason:
                    meta = d.meta
                    results[d.rid] = Result(
                        s.tokenizer.decode(toks),
                        list(toks),
                        d.finished_reason,
                        meta.jump_forward_tokens,
                        meta.completion_tokens,
                    )
    assert len(results) == len(requests)
    assert not s.running and not s.waiting
    return results


def case_requests(s: Scheduler, cases: list[Case], temperatures=TEMPERATURES):
    reqs = []
    for case in cases:
        prompt = s.tokenizer.apply_chat_template([{"role": "user", "content": case.prompt}])
        ids = s.tokenizer.encode(prompt, add_special_tokens=False)
        for temp in temperatures:
            budget = GREEDY_MAX_NEW_TOKENS if temp == 0 else SAMPLED_MAX_NEW_TOKENS
            if not case.bounded:
                budget = UNBOUNDED_MAX_NEW_TOKENS
            params = {"temperature": temp, "max_new_tokens": budget, "seed": SEED}
            reqs.append((f"{case.name}@{temp}", ids, {**params, **case.sampling()}))
    return reqs


def assert_valid(results: BatchResults, cases: list[Case]) -> None:
    """Stopped outputs satisfy the constraint; length-ended ones are valid prefixes and rare."""
    by_name = {c.name: c for c in cases}
    cut: list[str] = []
    sampled = 0
    for rid, res in results.items():
        name, temp = rid.rsplit("@", 1)
        case = by_name[name]
        sampled += float(temp) > 0
        assert res.finish.kind in ("stop", "length"), (rid, res.finish)
        if res.finish.kind == "stop":
            try:
                case.check(res.text)
            except Exception as e:
                name = results.backend.name
                raise AssertionError(f"{name} {rid}: invalid output {res.text!r}: {e}") from e
            continue
        assert float(temp) > 0 or not case.bounded, f"{rid} ran out of tokens: {res.text!r}"
        assert_grammar_prefix(results.backend, case, res.tokens)
        cut.append(rid)
    assert len(cut) <= MAX_LENGTH_SHARE_SAMPLED * max(sampled, 1) + 1, cut


def assert_grammar_prefix(backend: BaseGrammarBackend, case: Case, tokens: list[int]) -> None:
    kind, spec = SamplingParams.from_dict(case.sampling()).constraint  # type: ignore[misc]
    grammar = backend.create_grammar(backend.compile(kind, spec))
    assert grammar.accept_tokens(tokens) == len(tokens), f"{case.name}: not a grammar prefix"


LONG_ARRAY = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
    "required": ["items"],
}


@pytest.fixture(scope="module")
def xgrammar_on(scheduler):
    extra = [
        ("long@0.0", [*_prompt(scheduler, "List forty words.")], _long_params()),
        (
            "broken@0.0",
            _prompt(scheduler, "Hi"),
            {"json_schema": '{"type": "object", "properties": 5}'},
        ),
    ]
    return run_batch(scheduler, "xgrammar", True, case_requests(scheduler, ALL_CASES) + extra)


@pytest.fixture(scope="module")
def xgrammar_off(scheduler):
    return run_batch(scheduler, "xgrammar", False, case_requests(scheduler, ALL_CASES))


@pytest.fixture(scope="module")
def outlines_on(scheduler):
    return run_batch(scheduler, "outlines", True, case_requests(scheduler, ALL_CASES))


@pytest.fixture(scope="module")
def outlines_off(scheduler):
    cases = [c for c in ALL_CASES if c.outlines_ok]
    return run_batch(scheduler, "outlines", False, case_requests(scheduler, cases, (0.0,)))


def _prompt(s: Scheduler, text: str) -> list[int]:
    rendered = s.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return s.tokenizer.encode(rendered, add_special_tokens=False)


def _long_params() -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": 12, "json_schema": json.dumps(LONG_ARRAY)}


def test_case_list_covers_the_brief():
    kinds = {c.kind for c in ALL_CASES}
    assert len(ALL_CASES) >= 40 and kinds == {
        "json_schema",
        "regex",
        "ebnf",
        "choices",
        "json_object",
    }


def test_xgrammar_jump_forward_outputs_are_valid(scheduler, xgrammar_on):
    results = BatchResults(xgrammar_on.backend)
    results.update((k, v) for k, v in xgrammar_on.items() if k not in ("long@0.0", "broken@0.0"))
    assert_valid(results, ALL_CASES)
    for case in ALL_CASES:  # every object schema starts with a forced key
        if case.kind == "json_schema" and case.spec.get("type") == "object":
            assert results[f"{case.name}@0.0"].jump_forward_tokens > 0, case.name
    stats = scheduler.internal_state()
    assert stats.grammar is not None and stats.grammar.grammar_rejected_tokens == 0


def test_xgrammar_without_jump_forward_is_valid(scheduler, xgrammar_off, xgrammar_on):
    assert_valid(xgrammar_off, ALL_CASES)
    assert all(r.jump_forward_tokens == 0 for r in xgrammar_off.values())
    same = [
        c.name
        for c in ALL_CASES
        if xgrammar_off[f"{c.name}@0.0"].text == xgrammar_on[f"{c.name}@0.0"].text
    ]
    # Greedy text matches where the model's own tokens were canonical anyway (choices, regexes);
    # elsewhere jump-forward feeds canonical tokens (`{"` + `name`) where the model alone picks
    # other splits (`{` + `"`), so the contexts, and then the texts, may differ.
    print(f"greedy text identical with and without jump-forward: {len(same)}/{len(ALL_CASES)}")
    assert len(same) >= len(ALL_CASES) // 4


@pytest.fixture(scope="module")
def xgrammar_on_overlapped(default_model_folder):
    args = ServerArgs.from_kwargs(
        dtype="bfloat16",
        max_total_tokens=24000,
        grammar_backend="xgrammar",
        debug_invariants=True,
        enable_overlap_schedule=True,
    )
    s = build_scheduler(args, default_model_folder)
    assert s.overlap
    steps_in_flight = count_steps_in_flight(s)
    results = run_batch(s, "xgrammar", True, case_requests(s, ALL_CASES))
    return results, sum(steps_in_flight)


def test_xgrammar_under_overlap_gives_the_synchronous_outputs(xgrammar_on, xgrammar_on_overlapped):
    # constrained steps overlap (step N+1 launched before N's tokens are accepted); N+1's masks
    # see N's tokens, and a jump-forward drops the token N+1 ran for that request
    results, overlapped_steps = xgrammar_on_overlapped
    assert overlapped_steps > 20
    assert_valid(results, ALL_CASES)
    # greedy and seeded temperature-1.0 requests alike (a request's draws are its own)
    differ = [rid for rid in results if results[rid].tokens != xgrammar_on[rid].tokens]
    assert not differ, differ
    assert sum(r.jump_forward_tokens for r in results.values()) > 0


def test_outlines_outputs_are_valid_and_refusals_clear(scheduler, outlines_on, outlines_off):
    supported = [c for c in ALL_CASES if c.outlines_ok]
    assert len(supported) >= 25
    names = {c.name for c in supported}
    ok = BatchResults(outlines_on.backend)
    ok.update((k, v) for k, v in outlines_on.items() if k.rsplit("@", 1)[0] in names)
    assert_valid(ok, supported)
    assert_valid(outlines_off, supported)
    assert sum(r.jump_forward_tokens for r in ok.values()) > 0
    for case in ALL_CASES:
        if not case.outlines_ok:
            reason = outlines_on[f"{case.name}@0.0"].finish
            assert reason.kind == "abort" and reason.status_code == 400, (case.name, reason)
            assert "outlines grammar backend" in reason.message


def test_budget_exhaustion_ends_with_length(xgrammar_on):
    res = xgrammar_on["long@0.0"]
    assert res.finish == FinishReason.length(12)
    assert res.completion_tokens == 12 and res.text.startswith('{"items":[')


def test_invalid_schema_fails_only_its_request(xgrammar_on):
    reason = xgrammar_on["broken@0.0"].finish
    assert reason.kind == "abort" and reason.status_code == 400
    assert reason.message.startswith("invalid json_schema:")
    assert sum(r.finish.kind == "stop" for r in xgrammar_on.values()) >= len(ALL_CASES)


def test_llguidance_end_to_end(scheduler):
    picks = [
        "person_bounds",
        "defs_ref",
        "zip_pattern",
        "ipv4",
        "arithmetic",
        "prefix_overlap",
        "object_person",
    ]
    cases = [c for c in ALL_CASES if c.name in picks]
    results = run_batch(scheduler, "llguidance", True, case_requests(scheduler, cases, (0.0,)))
    assert_valid(results, cases)
