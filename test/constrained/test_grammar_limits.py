"""Constraint size and depth limits: measured without recursion, refused as 400s naming the flag,
in the API's parameter parsing and again in the scheduler's grammar manager."""

from __future__ import annotations

import json

import pytest
from grammar_helpers import NO_LIMITS, VOCAB_SIZE, make_req, nested_array_schema

from radixgen.errors import GrammarError, InvalidRequestError
from radixgen.grammar_limits import GrammarSpecLimits, check_constraint, object_depth, text_depth
from radixgen.runtime.constrained.grammar_manager import GrammarManager
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import GrammarConfig


def nested_object_schema(depth: int) -> dict:
    """Objects in objects (`properties` adds a level each: JSON depth 2 * depth + 1)."""
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_depth_is_measured_iteratively_far_past_the_recursion_limit():
    deep = nested_array_schema(50_000)  # json.dumps would raise RecursionError on this
    assert object_depth(deep, stop_after=10**9) == 50_001
    assert object_depth(deep, stop_after=64) == 65  # stops early
    assert text_depth("json_schema", "[" * 50_000 + "]" * 50_000) == 50_000
    assert object_depth({"a": [1, {"b": []}]}, 100) == 4 and object_depth(3, 100) == 0


def test_text_depth_skips_strings_escapes_and_classes():
    assert text_depth("json_schema", json.dumps({"pattern": "[[[{{{", "x": [[1]]})) == 3
    assert text_depth("regex", r"\(\(\([(((]a((b))") == 2
    assert text_depth("ebnf", 'root ::= ("(((" [(] (x))') == 2
    assert text_depth("choices", '["((("]') == 0


def test_object_schema_too_deep_is_a_400_naming_the_limit_not_a_recursion_error():
    for schema in (nested_object_schema(500), nested_array_schema(900), nested_array_schema(5000)):
        with pytest.raises(GrammarError) as e:
            SamplingParams.from_dict({"json_schema": schema})
        assert e.value.status_code == 400 and e.value.param == "json_schema"
        assert "nested more than 64 levels deep" in e.value.message
        assert "grammar_max_depth" in e.value.message


def test_text_specs_over_the_limits_are_400s():
    limits = GrammarSpecLimits(max_depth=8, max_spec_bytes=1000)
    cases = [
        ({"json_schema": json.dumps(nested_array_schema(8))}, "grammar_max_depth"),
        ({"regex": "(" * 9 + "a" + ")" * 9}, "grammar_max_depth"),
        ({"ebnf": "root ::= " + "(" * 9 + '"a"' + ")" * 9}, "grammar_max_depth"),
        ({"regex": "a" * 1001}, "grammar_max_spec_bytes"),
        ({"choices": ["é" * 300, "b" * 300]}, "grammar_max_spec_bytes"),  # counted in bytes
    ]
    for params, flag in cases:
        with pytest.raises(InvalidRequestError) as e:
            SamplingParams.from_dict(params, limits)
        assert flag in e.value.message and e.value.status_code == 400, params
    # at the limits: accepted
    SamplingParams.from_dict({"json_schema": nested_array_schema(7)}, limits)
    SamplingParams.from_dict({"regex": "(" * 8 + "a" + ")" * 8}, limits)
    check_constraint("regex", "a" * 1000, limits)


def test_grammar_manager_refuses_over_limit_specs_without_compiling(tokenizer):
    # a request that skipped the API's check (e.g. straight onto the scheduler's socket)
    gm = GrammarManager(GrammarConfig(grammar_max_depth=16), tokenizer, VOCAB_SIZE, [2])
    try:
        req = make_req("deep", limits=NO_LIMITS, json_schema=nested_array_schema(40))
        gm.submit(req)
        ready, failed = gm.poll([req])
        assert not ready and failed == [req]
        reason = req.finished_reason
        assert reason.status_code == 400 and "grammar_max_depth" in reason.message
        assert gm.stats().grammar_compiles == 0 and gm.pool.worker_pids() == []
    finally:
        gm.shutdown()
