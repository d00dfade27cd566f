"""Audit of the per-backend JSON-schema gap tables (schema_support.py) by measurement, model-free.

A backend "enforces" a schema when every instance its mask lets through validates. Here the
masks are walked token by token on the real tokenizer: an instance the schema rejects must be
blocked (a token masked out, or no stop token at the end) by every backend the router would let
serve it; and for each gap the tables list, the library really fails (refuses the keyword, or
lets a violating instance through), so no refusal is made without cause.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import llguidance
import pytest
from grammar_helpers import EOS, is_allowed, mask_of
from schema_corpus import MADE_HERE, schemastore_schemas, suite_schemas

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
from radixgen.runtime.constrained.schema_checks import plan_checks, serving_plan
from radixgen.runtime.constrained.schema_rewrite import rewrite_schema
from radixgen.runtime.constrained.schema_support import (
    SCHEMA_GAPS,
    backend_gaps,
    choose_schema_backend,
    schema_backends,
    schema_features,
)
from radixgen.runtime.constrained.value_checker import ValueChecker

AUDITED = ("xgrammar", "llguidance")
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
ORDER = ["xgrammar", "llguidance"]


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **extra}


_INT = {"type": "integer"}
_STR = {"type": "string"}
# feature -> (a schema using it, instances it rejects); one probe per gap-table entry
# (not, if and the dependency keywords: forms their exact rewrites, schema_rewrite.py, leave)
_FIVE = {f"p{i}": _INT for i in range(5)} | {"q": _INT}  # 2^5 branches: over the bound
PROBES: dict[str, tuple[Any, list[Any]]] = {
    "not": ({"type": "string", "not": {"const": "x"}}, ["x"]),
    "if": (
        _obj({"a": _STR, "b": _INT}, **{"if": _obj({"a": {"const": "x"}}, required=["a"])})
        | {"then": {"required": ["b"]}},
        [{"a": "x"}],
    ),
    "uniqueItems": ({"type": "array", "items": _INT, "uniqueItems": True}, [[1, 1]]),
    "contains": ({"type": "array", "items": _INT, "contains": {"const": 5}}, [[1]]),
    "minContains": (
        {"type": "array", "items": _INT, "contains": {"const": 1}, "minContains": 2},
        [[1], [1, 2]],
    ),
    "maxContains": (
        {"type": "array", "items": _INT, "contains": {"const": 1}, "maxContains": 1},
        [[1, 1]],
    ),
    "dependentRequired": (
        _obj(_FIVE, dependentRequired={f"p{i}": ["q"] for i in range(5)}),
        [{"p0": 1}],
    ),
    "dependentSchemas": (
        _obj(_FIVE, dependentSchemas={f"p{i}": {"required": ["q"]} for i in range(5)}),
        [{"p0": 1}],
    ),
    "dependencies": (
        _obj(_FIVE, dependencies={f"p{i}": ["q"] for i in range(5)}, **{"$schema": DRAFT7}),
        [{"p0": 1}],
    ),
    "a property schema false (beside additionalProperties)": (
        _obj({"a": False}, additionalProperties=_INT),
        [{"a": 1}],
    ),
    "unevaluatedItems": (
        {"type": "array", "prefixItems": [_INT], "unevaluatedItems": False},
        [[1, 2]],
    ),
    "a type-specific keyword without type": ({"minimum": 2}, [1]),
    "oneOf": ({"oneOf": [_INT, {"type": "number"}]}, [1]),
    "allOf": (
        {"allOf": [_obj({"a": _INT}, required=["a"]), _obj({"b": _INT}, required=["b"])]},
        [{"a": 1}],
    ),
    "required (a name not in properties)": (_obj({"a": _INT}, required=["a", "b"]), [{"a": 1}]),
    "$ref with sibling keywords": (
        {"$ref": "#/$defs/n", "$defs": {"n": _INT}, "minimum": 3},
        [1],
    ),
    "$ref (not a local #/ pointer)": (
        {"$id": "http://x.test/s", "$defs": {"a": _INT}, "$ref": "http://x.test/s#/$defs/a"},
        ["x"],
    ),
    "patternProperties": ({"patternProperties": {"f.*o": _INT}}, [{"fooo": "s"}]),
    "pattern with minLength/maxLength": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        ["abcdef"],
    ),
    "items (array form)": (
        {"type": "array", "items": [_INT, {"type": "string"}], "additionalItems": False}
        | {"$schema": DRAFT7},
        [["a", 1]],
    ),
    "exclusiveMinimum/exclusiveMaximum (boolean form)": (
        {"type": "number", "minimum": 0, "exclusiveMinimum": True, "$schema": DRAFT4},
        [0],
    ),
    "unevaluatedProperties": (_obj({"a": _INT}, unevaluatedProperties=False), [{"a": 1, "b": 2}]),
    "propertyNames": (
        {"type": "object", "propertyNames": {"maxLength": 2}, "additionalProperties": _INT},
        [{"abc": 1}],
    ),
    # a $ref branch is not merged (schema_rewrite.py), so the keywords stay beside the anyOf
    "keywords beside anyOf/oneOf": (
        {
            "$defs": {"n": {"type": "integer", "maximum": 5}},
            "type": "integer",
            "minimum": 3,
            "anyOf": [{"$ref": "#/$defs/n"}, {"type": "integer", "maximum": 9}],
        },
        [1, 10],
    ),
    "keywords beside enum/const": (
        {"enum": [1, 5, "abc"], "minimum": 3, "maxLength": 2},
        [1, "abc"],
    ),
}


def compact(instance: Any) -> str:
    return json.dumps(instance, separators=(",", ":"), ensure_ascii=False)


def walks(grammar: BaseGrammarObject, encode: Any, text: str) -> bool:
    """Whether the mask lets `text` through to the stop token."""
    for tok in encode(text):
        if not is_allowed(mask_of(grammar), tok) or not grammar.accept_token(tok):
            return False
    return is_allowed(mask_of(grammar), EOS)


def raw_compile(backend: BaseGrammarBackend, schema: Any) -> Any:
    """The library's own compile of the schema, without our gap check (None: it refused)."""
    spec = json.dumps(schema)
    try:
        if backend.name == "xgrammar":
            return backend.compiler.compile_json_schema(  # type: ignore[attr-defined]
                spec,
                strict_mode=True,
                **backend._json_options,  # type: ignore[attr-defined]
            )
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            spec,
            overrides={**backend._json_overrides, "coerce_one_of": True},  # type: ignore[attr-defined]
        )
        matcher = llguidance.LLMatcher(backend.lltok, grammar, log_level=0)  # type: ignore[attr-defined]
        return None if matcher.is_error() else matcher
    except Exception:
        return None


def test_every_gap_has_a_probe():
    assert set().union(*SCHEMA_GAPS.values()) == set(PROBES)
    for feature, (schema, _) in PROBES.items():
        assert feature in {g.feature for g in schema_features(schema)}, feature


@pytest.mark.parametrize("name", AUDITED)
@pytest.mark.parametrize("feature", sorted(PROBES))
def test_listed_gap_is_measured(backends, encode, name, feature):
    """A gap in the table is real: the library refuses the probe or lets a violation through;
    a feature not in the table is enforced: the violation is blocked."""
    schema, bad = PROBES[feature]
    backend = backends[name]
    for instance in bad:
        assert not jsonschema.validators.validator_for(schema)(schema).is_valid(instance)
    if feature in SCHEMA_GAPS[name]:
        if not _checked(schema):  # else: served relaxed, the scheduler checks the values
            with pytest.raises(GrammarError, match="cannot enforce"):
                backend.compile("json_schema", json.dumps(schema))
        compiled = raw_compile(backend, schema)
        if compiled is not None:
            leaks = [x for x in bad if walks(backend.create_grammar(compiled), encode, compact(x))]
            assert leaks, f"{name} enforces {feature} after all: take it off its gap list"
    elif backend_gaps(schema)[name]:  # the probe also uses another of this backend's gaps
        with pytest.raises(GrammarError, match="cannot enforce"):
            backend.compile("json_schema", json.dumps(schema))
    else:
        compiled = backend.compile("json_schema", json.dumps(schema))
        for instance in bad:
            assert not walks(backend.create_grammar(compiled), encode, compact(instance))


def _checked(schema: Any) -> bool:
    """Whether the checked layer serves the schema (its rewrite may be refused first)."""
    try:
        return plan_checks(rewrite_schema(schema).schema) is not None
    except GrammarError:
        return False


def _audit_cases() -> list[Any]:
    return [pytest.param(item, id=item.name) for item in [*MADE_HERE, *suite_schemas()]]


@pytest.mark.parametrize("item", _audit_cases())
def test_corpus_instances_against_the_masks(backends, encode, item):
    """Every backend allowed to serve a corpus schema blocks each of its invalid instances, and
    the fallback choice serves it unless some keyword is enforced by no backend."""
    rewritten = rewrite_schema(item.schema).schema
    plan = plan_checks(rewritten)  # the checked layer: the backends compile plan.schema
    gaps = backend_gaps(rewritten if plan is None else plan.schema)
    try:
        chosen = serving_plan(item.spec, ORDER)[0][0]
    except GrammarError as e:
        assert all(gaps[n] for n in ORDER)
        assert "'" in str(e)  # names the keyword
        return
    assert not gaps[chosen]
    cls = jsonschema.validators.validator_for(item.schema)
    validator = cls(item.schema, format_checker=cls.FORMAT_CHECKER)
    for name in AUDITED:
        if gaps[name]:
            continue
        try:
            compiled = backends[name].compile("json_schema", item.spec)
        except GrammarError:
            continue  # the library refuses it (e.g. a remote $ref): a 400, never a wrong output
        for instance in item.invalid:
            if validator.is_valid(instance):
                continue  # a format this machine's jsonschema cannot check
            text = compact(instance)
            if plan is not None and walks(backends[name].create_grammar(compiled), encode, text):
                checker = ValueChecker(plan, [bytes([b]) for b in range(256)])
                assert checker.advance(list(text.encode()), True) is not None, (
                    f"{name} and the checks let invalid {text} through"
                )
                continue
            assert not walks(backends[name].create_grammar(compiled), encode, text), (
                f"{name} lets invalid {text} through"
            )


def test_required_name_missing_from_properties_goes_to_llguidance():
    schema = _obj({"a": _INT}, required=["a", "b"])
    gaps = backend_gaps(schema)
    assert [g.feature for g in gaps["xgrammar"]] == ["required (a name not in properties)"]
    assert not gaps["llguidance"]
    assert choose_schema_backend(json.dumps(schema), ORDER) == "llguidance"


def test_refusal_names_the_keyword():
    schema = {"type": "array", "items": _INT, "uniqueItems": True}
    with pytest.raises(GrammarError, match="'uniqueItems' \\(at /\\), which no grammar backend"):
        choose_schema_backend(json.dumps(schema), ORDER)
    split = _obj(
        {"a": {"type": "string", "pattern": "^a", "maxLength": 2}}, propertyNames={"maxLength": 1}
    )
    with pytest.raises(GrammarError, match="xgrammar cannot enforce 'pattern with minLength"):
        choose_schema_backend(json.dumps(split), ORDER)


@pytest.mark.parametrize(
    ("one_of", "disjoint"),
    [
        ([{"type": "integer"}, {"type": "string"}], True),
        ([{"type": "integer"}, {"type": "number"}], False),
        ([{"const": "a"}, {"enum": ["b", "c"]}], True),
        ([{"enum": [1]}, {"enum": [1.0]}], False),
        (
            [
                _obj({"k": {"const": "a"}}, required=["k"]),
                _obj({"k": {"const": "b"}, "x": _INT}, required=["k", "x"]),
            ],
            True,
        ),
        ([_obj({"k": {"const": "a"}}), _obj({"k": {"const": "b"}})], False),  # k optional
        ([{"properties": {"k": {"const": "a"}}, "required": ["k"]}, _INT], False),  # no type
    ],
)
def test_one_of_served_only_when_disjoint(one_of, disjoint):
    features = {g.feature for g in schema_features({"oneOf": one_of})}
    assert ("oneOf" not in features) is disjoint


def test_unknown_format_is_an_annotation_for_llguidance(backends, encode):
    schema = {"type": "string", "format": "color-hex", "maxLength": 4}
    compiled = backends["llguidance"].compile("json_schema", json.dumps(schema))
    assert walks(backends["llguidance"].create_grammar(compiled), encode, '"red"')
    assert not walks(backends["llguidance"].create_grammar(compiled), encode, '"green"')


def test_schemastore_schemas_are_served_or_refused_by_name(backends):
    """Each SchemaStore document and definition compiles on one of its exact backends (the
    manager tries them in order), or is refused naming keywords; the only library failures
    left are $refs to other documents, which no backend can fetch."""
    served, refused, unfetchable = 0, 0, 0
    for item in schemastore_schemas():
        try:
            names = schema_backends(item.spec, ORDER)
        except GrammarError as e:
            assert "' (at " in str(e), str(e)
            refused += 1
            continue
        errors = []
        for name in names:
            try:
                backends[name].compile("json_schema", item.spec)
                break
            except GrammarError as e:
                errors.append(str(e))
        else:
            assert all("is not present in a registry" in e for e in errors), (item.name, errors)
            unfetchable += 1
            continue
        served += 1
    counts = (served, refused, unfetchable)
    assert served >= 119 and sum(counts) == len(schemastore_schemas()), counts


def test_llguidance_closes_objects_only_where_that_keeps_instances(backends, encode):
    """Like xgrammar's strict mode, undeclared keys are masked out; but not where closing could
    exclude every instance (a required name declared nowhere, allOf parts)."""

    def serves(schema: Any, text: str) -> bool:
        compiled = backends["llguidance"].compile("json_schema", json.dumps(schema))
        return walks(backends["llguidance"].create_grammar(compiled), encode, text)

    assert serves(_obj({"a": _INT}), '{"a":1}')
    assert not serves(_obj({"a": _INT}), '{"a":1,"b":2}')
    open_required = _obj({"a": _INT}, required=["a", "b"])
    assert serves(open_required, '{"a":1,"b":2}')
    parts = {"allOf": [_obj({"a": _INT}, required=["a"]), _obj({"b": _INT}, required=["b"])]}
    assert serves(parts, '{"a":1,"b":2}')
    # a part named by $ref stays open too (JSONSchemaBench's Github_easy/o58616 was refused as
    # "unsatisfiable": its person definition was closed, and the other part requires a club)
    named = {
        "definitions": {
            "person": _obj({"a": _INT}, required=["a"]),
            "alias": {"$ref": "#/definitions/person"},
        },
        "type": "object",
        "allOf": [{"$ref": "#/definitions/alias"}, _obj({"b": _INT}, required=["b"])],
    }
    assert serves(named, '{"a":1,"b":2}')
    assert not serves(named, '{"b":2}')
