"""Grammar-aware speculative decoding on the real default model, driving the in-process Scheduler.

Every case of the constrained matrix (JSON schemas, regex, EBNF, choices) runs as one batch with
n-gram speculation on and xgrammar jump-forward on, greedy and seeded temperature 1.0 (rejection
sampling: each verified position draws with the request's own seeded uniform): every output
must satisfy its constraint and equal the output without speculation token for token (drafts walked by the grammar, each verified position
masked by the grammar's state there, jump-forward ending a verified run as it ends a decode).
"""

from __future__ import annotations

import pytest
from grammar_cases import ALL_CASES
from test_scheduler_grammar import assert_valid, case_requests, run_batch

from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.scheduler.scheduler_process import build_scheduler
from radixgen.server_args import ServerArgs

pytestmark = pytest.mark.slow  # the real model decodes whole batches (minutes)


def _scheduler(folder: str, speculative: bool) -> Scheduler:
    # the fixed cost rule: the default one learns from measured step times (load-dependent)
    flags = (
        {"speculative_algorithm": "NGRAM", "speculative_break_even_tokens": 16}
        if speculative
        else {}
    )
    args = ServerArgs.from_kwargs(
        dtype="bfloat16", max_total_tokens=24000, grammar_backend="xgrammar",
        debug_invariants=True, **flags,
    )  # fmt: skip
    return build_scheduler(args, folder)


def test_constrained_outputs_are_valid_and_identical(default_model_folder):
    spec = _scheduler(default_model_folder, True)
    on = run_batch(spec, "xgrammar", True, case_requests(spec, ALL_CASES))
    assert_valid(on, ALL_CASES)
    stats = spec.internal_state()
    assert stats.speculation.spec_verified_requests > 0
    assert stats.speculation.spec_accepted_tokens > 0
    base = _scheduler(default_model_folder, False)
    off = run_batch(base, "xgrammar", True, case_requests(base, ALL_CASES))
    for rid, res in off.items():
        assert on[rid].tokens == res.tokens, rid
        assert on[rid].finish == res.finish, rid
