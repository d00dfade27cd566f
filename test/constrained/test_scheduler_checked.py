"""The checked layer end to end on the real default model, driving the in-process Scheduler.

Greedy outputs of schemas served with checks (uniqueItems, multipleOf, overlapping oneOf) are
valid, with the rollbacks the checker made; a check past its rollback bound ends the request
with an abort naming the keyword and no invalid output; a schema without checked keywords is
decoded exactly as before (no checker, same tokens as with the layer's bound at zero).
"""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest

from radixgen.io_struct import TokenizedGenerateReq, apply_delta
from radixgen.runtime.constrained.grammar_manager import GrammarManager
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.scheduler.scheduler_process import build_scheduler
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import GrammarConfig, ServerArgs

pytestmark = pytest.mark.slow  # the real model decodes

UNIQUE = {
    "type": "object",
    "properties": {
        "colors": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": 9},
            "minItems": 4,
            "maxItems": 4,
            "uniqueItems": True,
        }
    },
    "required": ["colors"],
}
MULTIPLE = {
    "type": "object",
    "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 99, "multipleOf": 5}},
    "required": ["count"],
}
ONE_OF = {
    "type": "object",
    "properties": {
        "n": {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]}
    },
    "required": ["n"],
}
PLAIN = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
PROMPTS = {
    "unique": ("Give the colors field the list 1, 1, 1, 1.", UNIQUE),
    "multiple": ("Give a count of 7 as JSON.", MULTIPLE),
    "one_of": ("Give n = 4 as JSON.", ONE_OF),
    "plain": ("Describe a person as JSON.", PLAIN),
}


@pytest.fixture(scope="module")
def scheduler(default_model_folder) -> Scheduler:
    args = ServerArgs.from_kwargs(
        dtype="bfloat16", max_total_tokens=8000, grammar_backend="xgrammar", debug_invariants=True
    )
    return build_scheduler(args, default_model_folder)


def run(s: Scheduler, names: list[str], max_rollbacks: int) -> dict[str, Any]:
    """Greedy decode of the named cases as one batch; results by name."""
    s.grammar_manager = GrammarManager(GrammarConfig(), s.tokenizer, s.vocab_size, s.eos_token_ids)
    s.grammar_manager.max_value_rollbacks = max_rollbacks
    for name in names:
        prompt, schema = PROMPTS[name]
        chat = s.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        ids = s.tokenizer.encode(chat, add_special_tokens=False)
        params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(schema)}
        s.add_request(
            TokenizedGenerateReq(name, ids, SamplingParams.from_dict(params), time.time())
        )
    tokens: dict[str, list[int]] = {}
    out: dict[str, Any] = {}
    deadline = time.monotonic() + 300
    while s.has_work or s.grammar_waiting:
        assert time.monotonic() < deadline
        for msg in s.step():
            for d in msg.deltas:
                toks = apply_delta(tokens.setdefault(d.rid, []), d)
                if d.finished_reason:
                    text = s.tokenizer.decode(toks)
                    out[d.rid] = (text, d.finished_reason, d.meta, list(toks))
    return out


def test_checked_outputs_are_valid(scheduler) -> None:
    results = run(scheduler, ["unique", "multiple", "one_of"], max_rollbacks=8)
    for name, (text, finish, meta, _) in results.items():
        schema = PROMPTS[name][1]
        assert finish.kind == "stop", (name, finish, text)
        jsonschema.validate(json.loads(text), schema)
        assert meta.schema_checks, name
    assert results["unique"][2].schema_checks == ("uniqueItems",)
    assert results["multiple"][2].schema_checks == ("multipleOf",)
    assert results["one_of"][2].schema_checks == ("oneOf",)
    assert sum(r[2].schema_check_rollbacks for r in results.values()) > 0  # greedy broke some


def test_past_the_bound_ends_with_the_keyword_and_no_invalid_output(scheduler) -> None:
    results = run(scheduler, ["unique", "plain"], max_rollbacks=0)
    text, finish, _, _ = results["unique"]
    if finish.kind == "stop":  # greedy happened to be valid at once: nothing to test here
        jsonschema.validate(json.loads(text), UNIQUE)
        pytest.skip("greedy output needed no rollback")
    assert finish.is_abort and "'uniqueItems'" in (finish.message or ""), finish
    assert '"red","red"' not in text.replace(" ", "")  # the failed value was not sent


def test_unchecked_schema_decodes_as_before(scheduler) -> None:
    """No checker for a plain schema: the same tokens however the layer is bounded."""
    a = run(scheduler, ["plain"], max_rollbacks=8)["plain"]
    b = run(scheduler, ["plain"], max_rollbacks=0)["plain"]
    assert a[2].schema_checks == () and a[2].schema_check_rollbacks == 0
    assert a[3] == b[3] and a[1].kind == "stop"
    jsonschema.validate(json.loads(a[0]), PLAIN)


def test_rollbacks_under_overlap_give_the_synchronous_outputs(
    default_model_folder, scheduler
) -> None:
    """A rollback changes a request's tail after the next step ran its token: under overlap that
    token is dropped, and the outputs equal the synchronous scheduler's."""
    args = ServerArgs.from_kwargs(
        dtype="bfloat16",
        max_total_tokens=8000,
        grammar_backend="xgrammar",
        debug_invariants=True,
        enable_overlap_schedule=True,
    )
    overlapped = build_scheduler(args, default_model_folder)
    assert overlapped.overlap
    names = ["unique", "multiple", "one_of"]
    sync = run(scheduler, names, max_rollbacks=8)
    over = run(overlapped, names, max_rollbacks=8)
    assert sum(r[2].schema_check_rollbacks for r in over.values()) > 0
    for name in names:
        assert over[name][3] == sync[name][3], name
        assert over[name][1].kind == sync[name][1].kind
