"""The checked layer (issue 37 part 2): relaxed schemas, value checks, rollback bookkeeping.

Fast tier: the compile-side plan (schema_checks.py) and the run-time tracker
(value_checker.py), proven exact on the schema corpus' valid and invalid instances: an invalid
instance is rejected by the relaxed schema the grammar compiles or by a check, a valid one by
neither. The scheduler's rollback on the real model is in test_scheduler_checked.py (slow).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import validators
from schema_corpus import corpus

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.schema_checks import (
    ItemsFrom,
    plan_checks,
    relax_for_checks,
    serving_plan,
)
from radixgen.runtime.constrained.schema_rewrite import rewrite_schema
from radixgen.runtime.constrained.schema_support import schema_plan
from radixgen.runtime.constrained.value_checker import ValueChecker

ORDER = ["xgrammar", "llguidance"]
BYTES = [bytes([b]) for b in range(256)]  # a vocabulary of one token per byte

TAGS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
        "n": {"type": "integer", "multipleOf": 5},
        "o": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
    },
    "required": ["tags", "n", "o"],
}


def _ids(text: str) -> list[int]:
    return list(text.encode())


def test_plan_relaxes_and_places_checks() -> None:
    plan = plan_checks(TAGS)
    assert plan is not None
    assert plan.keywords == ("multipleOf", "oneOf", "uniqueItems")
    assert [c.path for c in plan.checks] == [("tags",), ("n",), ("o",)]
    assert plan.checks[0].unique_items
    props = plan.schema["properties"]
    assert "uniqueItems" not in props["tags"] and "multipleOf" not in props["n"]
    assert "anyOf" in props["o"] and "oneOf" not in props["o"]
    assert TAGS["properties"]["n"]["multipleOf"] == 5  # the input is not modified


def test_checks_follow_refs_and_items() -> None:
    schema = {
        "$defs": {"five": {"type": "integer", "multipleOf": 5}},
        "type": "array",
        "prefixItems": [{"type": "string"}],
        "items": {"$ref": "#/$defs/five"},
    }
    plan = plan_checks(schema)
    assert plan is not None
    assert [c.path for c in plan.checks] == [(ItemsFrom(1),)]
    assert "multipleOf" not in plan.schema["$defs"]["five"]
    assert plan.checks[0].matches((3,)) and not plan.checks[0].matches((0,))


def test_check_inside_any_of_covers_the_whole_branch_point() -> None:
    schema = {"anyOf": [{"type": "integer", "multipleOf": 3}, {"type": "string"}]}
    plan = plan_checks(schema)
    assert plan is not None and [c.path for c in plan.checks] == [()]


def test_schemas_without_checked_keywords_are_untouched() -> None:
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    disjoint = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
    for schema in (plain, disjoint):
        assert plan_checks(schema) is None
        assert relax_for_checks(schema) is schema
        spec = json.dumps(schema)
        assert serving_plan(spec, ORDER) == (*schema_plan(spec, ORDER), None)


def test_checked_schemas_are_served_not_refused() -> None:
    spec = json.dumps(TAGS)
    with pytest.raises(GrammarError, match="uniqueItems"):
        schema_plan(spec, ORDER)  # the masks alone cannot
    backends, rewrites, plan = serving_plan(spec, ORDER)
    assert backends[0] == "xgrammar" and rewrites == () and plan is not None


def test_relaxed_gaps_are_still_refused() -> None:
    schema = {**TAGS, "allOf": [{"required": ["n"]}, {"required": ["o"]}]}
    with pytest.raises(GrammarError, match="allOf"):
        serving_plan(
            json.dumps(
                {"type": "object", "properties": schema["properties"], **{"allOf": schema["allOf"]}}
            ),
            ["xgrammar"],
        )


@pytest.mark.parametrize(
    ("text", "keyword", "pointer", "start"),
    [
        ('{"tags":["a","b","a"],"n":5,"o":3}', "uniqueItems", "/tags/2", 17),
        ('{"tags":[],"n":7,"o":3}', "multipleOf", "/n", 15),
        ('{"tags":[],"n":5,"o":3}', "oneOf", "/o", 21),
    ],
)
def test_tracker_names_the_value_and_where_it_starts(
    text: str, keyword: str, pointer: str, start: int
) -> None:
    plan = plan_checks(TAGS)
    assert plan is not None
    failure = ValueChecker(plan, BYTES).advance(_ids(text), True)
    assert failure is not None
    assert (failure.keyword, failure.pointer, failure.token_index) == (keyword, pointer, start)


def test_valid_output_passes_and_root_number_completes_at_the_end() -> None:
    plan = plan_checks(TAGS)
    assert plan is not None
    assert ValueChecker(plan, BYTES).advance(_ids('{"tags":["c","a"],"n":10,"o":1}'), True) is None
    root = plan_checks({"type": "integer", "multipleOf": 3})
    assert root is not None
    checker = ValueChecker(root, BYTES)
    assert checker.advance(_ids("10"), False) is None  # 10 may still become 102
    failure = checker.advance(_ids("10"), True)
    assert failure is not None and failure.token_index == 0


def test_real_tokens_map_to_the_token_holding_the_value_start(encode, vocab) -> None:
    plan = plan_checks(TAGS)
    assert plan is not None
    text = '{"tags":["a","b","a"],"n":5,"o":3}'
    ids = encode(text)
    failure = ValueChecker(plan, vocab.token_bytes).advance(ids, True)
    assert failure is not None and failure.keyword == "uniqueItems"
    before = b"".join(vocab.token_bytes[t] for t in ids[: failure.token_index])
    holding = before + vocab.token_bytes[ids[failure.token_index]]
    assert len(before) <= text.index('"a"]') < len(holding)


def test_truncate_replays_and_bans_are_bounded() -> None:
    plan = plan_checks(TAGS)
    assert plan is not None
    checker = ValueChecker(plan, BYTES, max_rollbacks=2)
    ids = _ids('{"tags":["a","b","a"]')
    failure = checker.advance(ids, False)
    assert failure is not None
    k = failure.token_index
    assert checker.note_rollback(k, ids[k]) and checker.bans_at(k) == {ids[k]}
    checker.truncate(k, ids)
    assert checker.fed == k
    # the earlier items are remembered: "a" again still fails, "c" passes
    assert checker.advance(ids[:k] + _ids('"a"'), False) is not None
    checker.truncate(k, ids)
    assert checker.advance(ids[:k] + _ids('"c"]'), False) is None
    assert checker.note_rollback(k, 1) and not checker.note_rollback(k, 2)
    assert checker.total_rollbacks == 2
    # per request too: 8 times the per-position bound over all positions
    assert sum(checker.note_rollback(p, 0) for p in range(100, 120)) == 14


def _exact_on(schema: Any, instance: Any) -> bool:
    """Whether the relaxed schema and the checks together accept the instance."""
    rewritten = rewrite_schema(schema).schema
    plan = plan_checks(rewritten)
    assert plan is not None
    relaxed_ok = validators.validator_for(plan.schema)(plan.schema).is_valid(instance)
    text = json.dumps(instance, separators=(",", ":"))
    return relaxed_ok and ValueChecker(plan, BYTES).advance(_ids(text), True) is None


def test_relaxed_schema_plus_checks_is_exact_on_the_corpus() -> None:
    served = 0
    for item in corpus():
        if not item.valid and not item.invalid:
            continue
        try:
            rewritten = rewrite_schema(item.schema).schema
        except GrammarError:
            continue
        if plan_checks(rewritten) is None:
            continue
        served += 1
        for instance in item.valid:
            assert _exact_on(item.schema, instance), (item.name, instance)
        for instance in item.invalid:
            assert not _exact_on(item.schema, instance), (item.name, instance)
    assert served >= 5


def test_retry_search_order() -> None:
    """A number is redone from its last token back; a repeated item from the token before it."""
    plan = plan_checks(TAGS)
    assert plan is not None
    checker = ValueChecker(plan, BYTES, max_rollbacks=1)
    ids = _ids('{"tags":[],"n":12,')
    number = checker.advance(ids, False)
    assert number is not None and (number.token_index, number.last_token) == (15, 16)
    assert checker.retry_position(number, len(ids)) == 16
    checker.note_rollback(16, ids[16])
    assert checker.retry_position(number, len(ids)) == 15
    ids = _ids('{"tags":["a","a"]')
    repeated = ValueChecker(plan, BYTES).advance(ids, False)
    assert repeated is not None and repeated.keyword == "uniqueItems"
    assert checker.retry_position(repeated, len(ids)) == repeated.token_index - 1


def test_deep_schemas_plan_without_recursion():
    """A plain schema hundreds of levels deep needs no check and plans in one walk; a deep one
    with a checked keyword is refused by name, never a RecursionError (a 500)."""
    from grammar_helpers import nested_array_schema

    from radixgen.errors import GrammarError
    from radixgen.runtime.constrained.schema_checks import plan_checks

    assert plan_checks(nested_array_schema(2000)) is None
    deep = nested_array_schema(2000)
    deep["uniqueItems"] = True
    node = deep
    for _ in range(1999):
        node = node["items"]
    node["items"] = {"type": "integer", "multipleOf": 3}
    with pytest.raises(GrammarError, match=r"nested too deeply.*multipleOf"):
        plan_checks(deep)
