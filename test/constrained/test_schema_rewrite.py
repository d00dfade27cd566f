"""Exact schema rewrites (schema_rewrite.py): the rewritten schema accepts exactly what the
original does, by `jsonschema` over generated instances and over the draft-4 test suite's, and
the backends' masks let the valid instances through and block the invalid ones; schemas
without a rewritable keyword come back unchanged; what has no exact rewrite stays refused.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import jsonschema
import pytest
from grammar_helpers import EOS, VOCAB_SIZE, is_allowed, make_req, mask_of
from schema_corpus import MADE_HERE, schemastore_schemas, suite_schemas
from test_grammar_manager import settle

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarObject
from radixgen.runtime.constrained.grammar_manager import GrammarManager
from radixgen.runtime.constrained.schema_merge import UNSATISFIABLE, merge_schemas
from radixgen.runtime.constrained.schema_rewrite import (
    MAX_BRANCHES,
    rewrite_schema,
    rewrite_spec,
)
from radixgen.runtime.constrained.schema_support import (
    choose_schema_backend,
    drop_false_properties,
    schema_plan,
)
from radixgen.runtime.request_side.req_state import ReqState, build_output
from radixgen.server_args import GrammarConfig

ORDER = ["xgrammar", "llguidance"]
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
INT = {"type": "integer"}
STR = {"type": "string"}


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **extra}


# name -> (schema, the rewrites it must report)
CASES: dict[str, tuple[Any, list[str]]] = {
    "not-required": (
        _obj({"a": INT, "b": INT, "c": INT}, **{"not": {"required": ["a", "b"]}}),
        ["not:required"],
    ),
    "not-required-open": (
        _obj({"a": INT}, additionalProperties=STR, **{"not": {"required": ["a", "z"]}}),
        ["not:required"],
    ),
    "not-type": ({"type": ["integer", "string", "null"], "not": {"type": "string"}}, ["not:type"]),
    "not-type-untyped": ({"not": {"type": ["null", "object", "array"]}}, ["not:type"]),
    "not-enum-integer": (
        {"type": "integer", "minimum": 0, "maximum": 6, "not": {"enum": [2, 4]}},
        ["not:enum"],
    ),
    "not-const-boolean": ({"type": ["boolean", "null"], "not": {"const": True}}, ["not:const"]),
    "not-type-beside-enum": ({"enum": ["a", 1, None], "not": {"type": "string"}}, ["not:type"]),
    "not-const-in-enum": ({"enum": ["a", "b", "c"], "not": {"const": "b"}}, ["not:const"]),
    "not-const-number": ({"type": "number", "not": {"const": 2.5}}, ["not:const"]),
    "not-enum-other-type": (
        {"type": "string", "maxLength": 2, "not": {"enum": [1, None]}},
        ["not:enum"],
    ),
    "not-anyOf": (
        _obj(
            {"a": INT, "b": INT, "c": INT},
            **{"not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
        ),
        ["not:anyOf"],
    ),
    "not-properties": (
        _obj(
            {"k": {"enum": ["x", "y", "z"]}, "n": INT},
            **{"not": {"properties": {"k": {"const": "x"}}, "required": ["k"]}},
        ),
        ["not:properties+required"],
    ),
    "not-in-property": (
        _obj({"color": {"enum": ["red", "green", "blue"], "not": {"const": "red"}}, "n": INT}),
        ["not:const"],
    ),
    "dependencies-array": (
        _obj({"a": INT, "b": INT, "c": INT}, dependencies={"a": ["b"], "c": ["a", "b"]})
        | {"$schema": DRAFT7},
        ["dependencies"],
    ),
    "dependencies-schema": (
        _obj(
            {"a": INT, "b": INT},
            dependencies={"a": {"properties": {"b": {"minimum": 3}}, "required": ["b"]}},
        )
        | {"$schema": DRAFT7},
        ["dependencies"],
    ),
    "dependentRequired": (
        _obj(
            {"a": INT, "b": INT, "c": STR},
            required=["c"],
            dependentRequired={"a": ["b"], "b": ["a"]},
        ),
        ["dependentRequired"],
    ),
    "dependentSchemas": (
        _obj({"a": INT, "b": INT}, dependentSchemas={"a": {"properties": {"b": {"maximum": 2}}}}),
        ["dependentSchemas"],
    ),
    "if-then-else": (
        _obj(
            {"kind": {"enum": ["x", "y"]}, "n": INT, "s": STR},
            required=["kind"],
            **{"if": {"properties": {"kind": {"const": "x"}}}},
            then={"required": ["n"]},
            **{"else": {"required": ["s"]}},
        ),
        ["if"],
    ),
    "if-required-then": (
        _obj({"a": INT, "b": INT}, **{"if": {"required": ["a"]}, "then": {"required": ["b"]}}),
        ["if"],
    ),
    "if-type-then": (
        {
            "type": ["integer", "string"],
            "if": {"type": "integer"},
            "then": {"minimum": 3},
            "else": {"maxLength": 1},
        },
        ["if"],
    ),
    "together": (
        _obj(
            {"a": INT, "b": INT, "c": {"enum": [1, 2, 3], "not": {"const": 2}}},
            dependentRequired={"a": ["b"]},
            anyOf=[{"required": ["a"]}, {"required": ["c"]}],
            **{"not": {"required": ["b", "c"]}},
        ),
        ["dependentRequired", "not:const", "not:required"],
    ),
    # measured on main: xgrammar serves the anyOf/oneOf/enum alone, letting 1, {} and "x" through
    "anyOf-siblings-integer": (
        {"type": "integer", "minimum": 3, "anyOf": [{**INT, "maximum": 5}, {**INT, "maximum": 9}]},
        ["anyOf:siblings"],
    ),
    "anyOf-siblings-object": (
        _obj(
            {"a": INT},
            required=["a"],
            anyOf=[_obj({"a": {**INT, "maximum": 3}}), {"type": "null"}],
        ),
        ["anyOf:siblings"],
    ),
    "oneOf-siblings": (
        {"type": ["integer", "string"], "minimum": 3, "oneOf": [{**INT, "maximum": 5}, STR]},
        ["oneOf:siblings"],
    ),
    "enum-beside-type": ({"type": "integer", "enum": [1, 2, "x"]}, ["enum:type"]),
    "in-defs": (
        {
            "$defs": {"p": _obj({"a": INT, "b": INT}, dependentRequired={"a": ["b"]})},
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/p"}},
        },
        ["dependentRequired"],
    ),
    # $refs to another resource of the same bundle (schema_bundle.py)
    "ref-bundle-root-id": (
        {
            "$schema": DRAFT7,
            "$id": "https://example.com/s/root.json",
            "definitions": {"small": {**INT, "maximum": 3}},
            **_obj(
                {
                    "a": {"$ref": "https://example.com/s/root.json#/definitions/small"},
                    "b": {"$ref": "root.json#/definitions/small"},
                }
            ),
        },
        ["$ref:bundle"],
    ),
    "ref-bundle-embedded": (
        {
            "$schema": DRAFT7,
            "$id": "https://example.com/s/root.json",
            "definitions": {
                "n": STR,  # a decoy: the pointer inside pair.json names pair.json's own `n`
                "color": {"$id": "color.json", "type": "string", "enum": ["red", "blue"]},
                "pair": {
                    "$id": "https://example.com/t/pair.json",
                    "anyOf": [{"$ref": "#/definitions/n"}, {"type": "null"}],
                    "definitions": {"n": {**INT, "maximum": 3}},
                },
            },
            **_obj({"a": {"$ref": "color.json"}, "b": {"$ref": "../t/pair.json"}}),
        },
        ["$ref:bundle"],
    ),
    "ref-bundle-anchor": (
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": {"s": {"$anchor": "small", **INT, "maximum": 2}},
            **_obj({"a": {"$ref": "#small"}, "b": STR}, required=["a"]),
        },
        ["$ref:bundle"],
    ),
    "ref-bundle-plain-name-id": (
        {
            "$schema": DRAFT4,
            "definitions": {"s": {"id": "#small", **INT, "maximum": 2}},
            **_obj({"a": {"$ref": "#small"}, "id": STR}, required=["a"]),
        },
        ["$ref:bundle"],
    ),
    # before 2019-09 a $ref overrides the keywords beside it (they were a gap of both backends)
    "ref-siblings-draft7": (
        {
            "$schema": DRAFT7,
            "definitions": {"small": {**INT, "maximum": 3}},
            **_obj(
                {"a": {"$ref": "#/definitions/small", "type": "string", "minimum": 10}, "b": STR}
            ),
        },
        ["$ref:siblings"],
    ),
    # a definition nothing refers to, which refers to a document no backend fetches: dropped
    "definitions-unreachable-remote": (
        {
            "definitions": {
                "used": {**INT, "maximum": 3},
                "unused": {"$ref": "https://example.com/other.json#/definitions/x"},
            },
            **_obj({"a": {"$ref": "#/definitions/used"}, "b": STR}),
        },
        ["definitions:unreachable"],
    ),
    # a `type` every branch already has: dropped (a $ref branch takes no merge)
    "type-implied-by-ref-branches": (
        {
            "definitions": {"p": {**INT, "maximum": 2}, "q": {**STR, "enum": ["a", "b"]}},
            "type": ["integer", "string"],
            "anyOf": [{"$ref": "#/definitions/p"}, {"$ref": "#/definitions/q"}],
        },
        ["type:implied"],
    ),
}

# forms with no exact positive rewrite: still refused, naming the keyword
STILL_REFUSED: dict[str, tuple[Any, str]] = {
    "not-const-string": ({"type": "string", "not": {"const": "x"}}, "not"),
    "not-non-integer": ({"type": "number", "not": {"type": "integer"}}, "not"),
    "not-const-number-draft4": (
        {"$schema": DRAFT4, "type": "number", "not": {"const": 2.5}},  # bounds would be booleans
        "not",
    ),
    "not-pattern": ({"type": "string", "not": {"pattern": "^a"}}, "not"),
    "if-string-const": (
        _obj(
            {"k": STR, "n": INT},
            **{"if": {"properties": {"k": {"const": "x"}}}, "then": {"required": ["n"]}},
        ),
        "if",
    ),
}

_ATOMS = [None, True, False, 0, 1, 2, 3, 4, 5, 7, -1, 2.5, "", "a", "b", "c", "x", "ab", [], {}]
_VALUES = [None, True, 0, 1, 2, 3, 4, 2.5, "x", "y", "s", "red", "blue", {"a": 1}, {"a": 1, "b": 2}]


def _names(schema: Any, out: list[str] | None = None) -> list[str]:
    """Every property name the schema mentions, in order of appearance."""
    out = [] if out is None else out
    if isinstance(schema, list):
        for s in schema:
            _names(s, out)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("properties", "dependencies", "dependentRequired", "dependentSchemas"):
                out.extend(n for n in value if n not in out)
            if key == "required" and isinstance(value, list):
                out.extend(n for n in value if n not in out)
            if key not in ("enum", "const"):
                _names(value, out)
    return out


def instances(schema: Any, count: int = 400, seed: int = 0) -> list[Any]:
    """Small instances around the schema: atoms, and objects over its property names (keys in
    the schema's order, as the backends emit them)."""
    rng = random.Random(seed)
    names = _names(schema)
    values = _VALUES + _literals(schema) * 3  # discriminators often
    out: list[Any] = list(_ATOMS)
    for r in range(len(names) + 1):
        for keys in itertools.combinations(names, r):
            out.append({k: rng.choice(values) for k in keys})
    while len(out) < count and names:
        keys = [n for n in names if rng.random() < 0.6]
        out.append({k: rng.choice(values) for k in keys})
    return out


def _literals(schema: Any) -> list[Any]:
    """The enum and const values the schema names (likely discriminators)."""
    if isinstance(schema, list):
        return [v for s in schema for v in _literals(s)]
    if not isinstance(schema, dict):
        return []
    found = [schema["const"]] if "const" in schema else []
    found += schema["enum"] if isinstance(schema.get("enum"), list) else []
    for key, value in schema.items():
        if key not in ("enum", "const"):
            found += _literals(list(value.values()) if isinstance(value, dict) else value)
    return found


def _valid(schema: Any, instance: Any) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(instance)


def compact(instance: Any) -> str:
    return json.dumps(instance, separators=(",", ":"), ensure_ascii=False)


def walks(grammar: BaseGrammarObject, encode: Any, text: str) -> bool:
    """Whether the mask lets `text` through to the stop token."""
    for tok in encode(text):
        if not is_allowed(mask_of(grammar), tok) or not grammar.accept_token(tok):
            return False
    return is_allowed(mask_of(grammar), EOS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrite_accepts_exactly_the_original_instances(name):
    schema, names = CASES[name]
    done = rewrite_schema(schema)
    assert sorted(done.rewrites) == sorted(names)
    tried = instances(schema)
    differ = [x for x in tried if _valid(schema, x) != _valid(done.schema, x)]
    assert not differ, (json.dumps(done.schema), differ[:5])
    assert any(_valid(schema, x) for x in tried) and not all(_valid(schema, x) for x in tried)


# an absent property beside an additionalProperties schema has no xgrammar form
LLGUIDANCE_ONLY = frozenset({"not-required-open"})


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewritten_schema_is_served_and_masks_agree(backends, encode, name):
    """Each exact backend's mask blocks every invalid instance and lets the valid ones through
    (those with only the top level's declared keys: the backends close objects)."""
    schema, names = CASES[name]
    served, rewrites = schema_plan(json.dumps(schema), ORDER)
    assert sorted(rewrites) == sorted(names)
    assert served == (["llguidance"] if name in LLGUIDANCE_ONLY else ORDER)
    declared = set(schema.get("properties", {}))
    for backend_name in served:
        backend = backends[backend_name]
        compiled = backend.compile("json_schema", json.dumps(schema))
        verdicts = set()
        for x in instances(schema, count=120, seed=1):
            valid = _valid(schema, x)
            if valid and isinstance(x, dict) and not x.keys() <= declared:
                continue
            text = compact(x)
            got = walks(backend.create_grammar(compiled), encode, text)
            assert got == valid, f"{backend_name}: {text} valid={valid} walked={got}"
            verdicts.add(valid)
        assert verdicts == {True, False}


# --- random schemas: every rewritable keyword, beside the others, in every draft --------------

_NAMES = ["a", "b", "c"]
_PICK = [None, True, False, 0, 1, 2, 3, 2.5, "x", "y"]
_DRAFTS = [DRAFT4, DRAFT7, "https://json-schema.org/draft/2020-12/schema", None]


def _leaf(r: random.Random) -> Any:
    return r.choice(
        [
            {"type": "integer", "minimum": r.randrange(4)},
            {"enum": r.sample(_PICK, r.randrange(1, 4))},
            {"const": r.choice(_PICK)},
            {"type": r.sample(["integer", "string", "null", "boolean", "number"], 2)},
            {"type": "number", "maximum": 2},
            STR,
            {},
        ]
    )


def _negatable(r: random.Random, depth: int = 0) -> Any:
    kinds = ["type", "required", "enum", "const", "properties"] + ["anyOf", "not"] * (depth == 0)
    kind = r.choice(kinds)
    if kind == "type":
        return {"type": r.choice(["string", "null", "object", ["integer", "string"], "number"])}
    if kind == "required":
        return {"required": r.sample(_NAMES, r.randrange(1, 3))}
    if kind == "enum":
        return {"enum": r.sample(_PICK, r.randrange(1, 3))}
    if kind == "const":
        return {"const": r.choice(_PICK)}
    if kind == "properties":
        return {"properties": {r.choice(_NAMES): {"const": r.choice(_PICK)}}}
    if kind == "anyOf":
        return {"anyOf": [_negatable(r, depth + 1), _negatable(r, depth + 1)]}
    return {"not": _negatable(r, depth + 1)}


def random_schema(r: random.Random) -> dict[str, Any]:
    """An object schema with one or two rewritable keywords beside ordinary ones."""
    s: dict[str, Any] = {}
    if r.random() < 0.8:
        s["type"] = r.choice(["object", ["object", "null"], ["object", "integer"]])
    s["properties"] = {n: _leaf(r) for n in r.sample(_NAMES, r.randrange(1, 4))}
    if r.random() < 0.4:
        s["required"] = r.sample(_NAMES, r.randrange(1, 3))
    if r.random() < 0.3:
        s["additionalProperties"] = r.choice([False, INT])
    if r.random() < 0.2:
        s["anyOf"] = [{"required": [r.choice(_NAMES)]}, {"properties": {r.choice(_NAMES): INT}}]
    for kw in r.sample(["not", "dependencies", "dependentRequired", "dependentSchemas", "if"], 2):
        then = {"properties": {r.choice(_NAMES): _leaf(r)}, "required": [r.choice(_NAMES)]}
        if kw == "not":
            s["not"] = _negatable(r)
        elif kw == "dependencies":
            s[kw] = {r.choice(_NAMES): r.choice([r.sample(_NAMES, 1), then])}
        elif kw == "dependentRequired":
            s[kw] = {n: r.sample(_NAMES, 1) for n in r.sample(_NAMES, 2)}
        elif kw == "dependentSchemas":
            s[kw] = {r.choice(_NAMES): then}
        else:
            s["if"], s["then"] = _negatable(r), then
            if r.random() < 0.6:
                s["else"] = r.choice([{"required": [r.choice(_NAMES)]}, _leaf(r), False])
    if r.random() < 0.3:  # nested: the rewrites happen below the top
        s = {"type": "object", "properties": {"x": s, "n": {"type": "integer", "not": _leaf(r)}}}
    draft = r.choice(_DRAFTS) or (DRAFT7 if "dependencies" in json.dumps(s) else None)
    return s if draft is None else {**s, "$schema": draft}


def _random_rewritten(count: int, seed: int) -> list[tuple[Any, Any]]:
    r = random.Random(seed)
    out = []
    while len(out) < count:
        schema = random_schema(r)
        try:
            done = rewrite_schema(schema)
        except GrammarError:  # over the branch bound
            continue
        if done.rewrites:
            out.append((schema, done.schema))
    return out


def test_random_schemas_keep_their_instances():
    """Property test: 200 random schemas, each over ~150 generated instances (the declared
    draft decides which keywords exist: `dependentRequired` is nothing in draft 7)."""
    for i, (schema, rewritten) in enumerate(_random_rewritten(200, seed=37)):
        for x in instances(schema, count=150, seed=i):
            assert _valid(schema, x) == _valid(rewritten, x), (schema, rewritten, x)


def test_random_schemas_masks_never_let_an_invalid_instance_through(backends, encode):
    for i, (schema, _) in enumerate(_random_rewritten(60, seed=38)):
        spec = json.dumps(schema)
        try:
            served = schema_plan(spec, ORDER)[0]
        except GrammarError:
            continue  # a form left refused
        for name in served:
            try:
                compiled = backends[name].compile("json_schema", spec)
            except GrammarError as e:  # only a schema no instance meets
                assert "cannot accept any value" in str(e) or "object schema" in str(e), e
                continue
            for x in instances(schema, count=40, seed=i):
                if not _valid(schema, x):
                    text = compact(x)
                    assert not walks(backends[name].create_grammar(compiled), encode, text), (
                        name,
                        schema,
                        text,
                    )


def _suite_with(keyword: str) -> list[Any]:
    return [i for i in suite_schemas() if i.name.startswith(f"suite/{keyword}/")]


@pytest.mark.parametrize(
    "item",
    [pytest.param(i, id=i.name) for i in _suite_with("not") + _suite_with("dependencies")],
)
def test_suite_instances_keep_their_verdict(item):
    """The draft-4 suite's `not` and `dependencies` groups: every rewritten one gives each of
    the suite's instances the suite's verdict."""
    done = rewrite_schema(item.schema)
    for instance in item.valid:
        assert _valid(done.schema, instance), (done.schema, instance)
    for instance in item.invalid:
        assert not _valid(done.schema, instance), (done.schema, instance)
    if not done.rewrites:
        with pytest.raises(GrammarError, match="' \\(at "):
            choose_schema_backend(item.spec, ORDER)


def test_suite_not_and_dependencies_are_mostly_served_now():
    groups = _suite_with("not") + _suite_with("dependencies")
    served = []
    for item in groups:
        try:
            choose_schema_backend(item.spec, ORDER)
            served.append(item.name)
        except GrammarError:
            pass
    assert len(served) >= len(groups) - 2, (len(served), len(groups))


def _rewritable(schema: Any) -> bool:
    text = json.dumps(schema)
    if any(f'"{k}"' in text for k in ("not", "dependencies", "dependentRequired", "if")):
        return True
    return any(("type" in s and "enum" in s) or _beside_any_of(s) for s in _nodes(schema))


def _beside_any_of(s: dict[str, Any]) -> bool:
    kept = {"$schema", "$id", "id", "$comment", "$defs", "definitions", "title", "description"}
    kept |= {"default", "examples", "deprecated", "readOnly", "writeOnly", "$anchor"}
    return any(k in s for k in ("anyOf", "oneOf")) and bool(s.keys() - kept - {"anyOf", "oneOf"})


def _nodes(schema: Any) -> list[dict[str, Any]]:
    """Every dict in the schema outside instance data (property maps included: a superset)."""
    if isinstance(schema, list):
        return [n for s in schema for n in _nodes(s)]
    if not isinstance(schema, dict):
        return []
    inner = [v for k, v in schema.items() if k not in ("enum", "const", "default", "examples")]
    return [schema, *_nodes(inner)]


def test_identity_on_schemas_without_rewritable_keywords():
    """Corpus schemas using none of the rewritten keywords (nor keywords beside an anyOf/oneOf,
    nor an enum beside a type) come back unchanged, and every schema nothing was rewritten in
    comes back as the same object and spec text, so it compiles (and decodes) as before."""
    items = [*MADE_HERE, *suite_schemas(), *schemastore_schemas()]
    checked = 0
    for item in items:
        done = rewrite_schema(item.schema)
        if not done.rewrites:
            assert rewrite_spec(item.spec) == (item.spec, ())
            assert done.schema is item.schema
            checked += 1
        if not _rewritable(item.schema):
            assert done.rewrites == ()
    assert checked > 100


@pytest.mark.parametrize("name", sorted(STILL_REFUSED))
def test_no_exact_form_stays_refused_by_keyword(name):
    schema, keyword = STILL_REFUSED[name]
    assert rewrite_schema(schema).rewrites == ()
    with pytest.raises(GrammarError, match=f"'{keyword}' \\(at /\\)"):
        choose_schema_backend(json.dumps(schema), ORDER)


def test_branch_bound_is_a_400_naming_it():
    names = [f"p{i}" for i in range(5)]  # 2^5 branches, none of them empty
    props = {n: INT for n in [*names, "q"]}
    schema = _obj(props, dependentRequired={n: ["q"] for n in names})
    with pytest.raises(
        GrammarError, match=f"'dependentRequired' \\(at /\\).*bound of {MAX_BRANCHES}"
    ):
        choose_schema_backend(json.dumps(schema), ORDER)
    small = _obj(props, dependentRequired={n: ["q"] for n in names[:4]})  # 2^4
    assert choose_schema_backend(json.dumps(small), ORDER) == "xgrammar"


def test_merge_is_exact_on_objects():
    a = _obj({"a": INT}, additionalProperties=False)
    b = _obj({"b": INT})
    assert merge_schemas(a, b) == _obj({"a": INT, "b": False}, additionalProperties=False)
    assert merge_schemas({"type": "integer"}, {"type": "string"}) is UNSATISFIABLE
    assert merge_schemas({"type": ["integer", "null"]}, {"type": "number"}) == {"type": "integer"}
    assert merge_schemas({"$ref": "#/x"}, {"type": "string"}) is None
    assert merge_schemas({"enum": [1, 2]}, {"const": 2}) == {"const": 2}
    # xgrammar reads an enum without its type: the values outside the type are dropped
    assert merge_schemas({"enum": ["a", 1, 2.0]}, {"type": "integer"}) == {
        "enum": [1, 2.0],
        "type": "integer",
    }
    assert merge_schemas({"const": "a"}, {"type": "integer"}) is UNSATISFIABLE


def test_false_properties_dropped_only_where_the_object_is_closed():
    closed = _obj({"a": False, "b": INT})
    assert drop_false_properties(closed) == _obj({"b": INT})
    open_ = _obj({"a": False, "b": INT}, additionalProperties=INT)
    assert drop_false_properties(open_) == open_
    assert "xgrammar" not in schema_plan(json.dumps(open_), ORDER)[0]


def test_meta_info_names_the_rewrites(tokenizer):
    gm = GrammarManager(GrammarConfig(), tokenizer, VOCAB_SIZE, [2])
    try:
        reqs = [
            make_req("rw", json_schema=CASES["not-required"][0]),
            make_req("plain", json_schema=_obj({"a": INT})),
        ]
        for r in reqs:
            gm.submit(r)
        ready, failed = settle(gm, reqs)
        assert not failed and len(ready) == 2
        assert reqs[0].meta().schema_rewrites == ("not:required",)
        assert reqs[0].grammar_backend == "xgrammar"
        assert reqs[1].meta().schema_rewrites == ()
        info = build_output(
            ReqState("rw", 3, False, 0, True, 0.0, meta=reqs[0].meta()), 0, tokenizer
        )
        assert info["meta_info"]["schema_rewrites"] == ["not:required"]
        plain = build_output(
            ReqState("p", 3, False, 0, True, 0.0, meta=reqs[1].meta()), 0, tokenizer
        )
        assert "schema_rewrites" not in plain["meta_info"]
    finally:
        gm.shutdown()


def _sibling_schema(r: random.Random) -> dict[str, Any]:
    """A node with keywords beside an anyOf or oneOf (or an enum beside a type)."""
    s: dict[str, Any] = {"type": r.choice(["object", "integer", ["integer", "string", "null"]])}
    if r.random() < 0.5:
        s["properties"] = {n: _leaf(r) for n in r.sample(_NAMES, r.randrange(1, 3))}
        s["required"] = r.sample(_NAMES, r.randrange(0, 2))
    if r.random() < 0.5:
        s[r.choice(["minimum", "maximum"])] = r.randrange(4)
    if r.random() < 0.3:
        s["enum"] = r.sample(_PICK, r.randrange(1, 5))
    key = r.choice(["anyOf", "oneOf"])
    s[key] = [
        r.choice([_leaf(r), _obj({r.choice(_NAMES): _leaf(r)}, required=[r.choice(_NAMES)])])
        for _ in range(r.randrange(1, 4))
    ]
    return s


def test_random_sibling_schemas_keep_their_instances():
    """Property test: keywords merged into anyOf/oneOf branches keep every instance's verdict."""
    r = random.Random(39)
    rewritten = 0
    for i in range(300):
        schema = _sibling_schema(r)
        done = rewrite_schema(schema)
        rewritten += bool(done.rewrites)
        for x in instances(schema, count=120, seed=i):
            assert _valid(schema, x) == _valid(done.schema, x), (schema, done.schema, x)
    assert rewritten > 200
