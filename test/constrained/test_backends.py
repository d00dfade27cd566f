"""Each grammar backend on the real tokenizer: kinds, masks, special tokens, errors, jump-forward, rollback."""

from __future__ import annotations

import json

import pytest
from grammar_helpers import BACKENDS, EOS, SPECIAL_IDS, allowed_ids, is_allowed, mask_of, spec_text

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.schema_checks import plan_checks
from radixgen.runtime.constrained.schema_rewrite import rewrite_schema

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
ARITH = 'root ::= expr\nexpr ::= num (("+" | "*") num)*\nnum ::= [0-9]+\n'

# (kind, spec, a valid instance)
VALID_WALKS = [
    ("json_schema", PERSON, '{"name":"Bob","age":42}'),
    ("regex", r"\d{4}-\d{2}-\d{2}", "2024-05-17"),
    (
        "regex",
        r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
        "192.168.0.1",
    ),
    ("ebnf", ARITH, "12+3*4"),
    ("choices", ["yes", "yes please", "no"], "yes please"),
    ("json_object", None, '{"a":[1,{"b":null}],"c":"x"}'),
]


@pytest.fixture
def build(compiled):
    """build(name, kind, spec) -> a fresh matcher of the (session-cached) compiled spec."""

    def make(name, kind, spec):
        backend, grammar = compiled(name, kind, spec_text(kind, spec))
        return backend.create_grammar(grammar)

    return make


def _supports(name: str, kind: str) -> bool:
    return not (name == "outlines" and kind in ("ebnf", "json_object"))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(("kind", "spec", "instance"), VALID_WALKS, ids=lambda v: str(v)[:20])
def test_valid_instance_walks_to_eos(build, encode, name, kind, spec, instance):
    if not _supports(name, kind):
        # a kind the backend cannot enforce is refused by name, never silently ignored
        with pytest.raises(GrammarError, match=f"does not support {kind} constraints"):
            build(name, kind, spec)
        return
    grammar = build(name, kind, spec)
    for tok in encode(instance):
        assert is_allowed(mask_of(grammar), tok), f"mask forbids {tok} of a valid instance"
        assert grammar.accept_token(tok)
    assert is_allowed(mask_of(grammar), EOS)
    assert not grammar.is_terminated()
    assert grammar.accept_token(EOS)
    assert grammar.is_terminated()


@pytest.mark.parametrize("name", BACKENDS)
def test_mask_allows_valid_and_forbids_invalid(build, encode, name):
    grammar = build(name, "json_schema", PERSON)
    start = allowed_ids(mask_of(grammar))
    # the canonical first token; llguidance allows only canonical splits of forced text
    assert encode('{"name')[0] in start
    for bad in ("[", "x", " {", "1"):
        assert encode(bad)[0] not in start, f"{bad!r} allowed at the start of an object"
    assert EOS not in start
    assert not grammar.accept_token(encode("[")[0])  # rejected, state unchanged
    assert grammar.accept_tokens(encode('{"name":"Al')) == len(encode('{"name":"Al'))
    inside = allowed_ids(mask_of(grammar))
    assert encode("ice")[0] in inside and encode('"')[0] in inside
    assert EOS not in inside


@pytest.mark.parametrize("name", BACKENDS)
def test_special_tokens_never_allowed_inside_json_string(build, encode, name):
    for prefix in ('{"name":"', '{"name":"Bob'):
        g = build(name, "json_schema", PERSON)
        assert g.accept_tokens(encode(prefix)) == len(encode(prefix))
        allowed = allowed_ids(mask_of(g))
        assert allowed.isdisjoint([*SPECIAL_IDS, EOS]), sorted(allowed & {*SPECIAL_IDS, EOS})
        assert len(allowed) > 40000  # ordinary text stays allowed
        for special in SPECIAL_IDS:
            assert not g.accept_token(special)
    if _supports(name, "json_object"):  # free-form JSON strings too
        g = build(name, "json_object", None)
        assert g.accept_tokens(encode('{"k":"')) == len(encode('{"k":"'))
        assert allowed_ids(mask_of(g)).isdisjoint([*SPECIAL_IDS, EOS])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    ("kind", "spec", "fragment"),
    [
        ("json_schema", "{bad", "invalid json_schema: not valid JSON"),
        ("json_schema", json.dumps({"type": "integer_or_what"}), "invalid json_schema"),
        ("regex", "(ab", "invalid regex"),
        ("ebnf", "root ::= undefined_rule", "invalid ebnf"),
        ("ebnf", 'root ::= "unterminated', "invalid ebnf"),
        ("choices", "[]", "invalid choices"),
    ],
)
def test_invalid_specs_raise_grammar_error(backends, name, kind, spec, fragment):
    if not _supports(name, kind):
        fragment = f"does not support {kind}"
    with pytest.raises(GrammarError) as info:
        backends[name].compile(kind, spec)
    assert fragment in str(info.value)
    assert info.value.status_code == 400


def test_outlines_refuses_what_it_cannot_do(backends):
    outlines = backends["outlines"]
    with pytest.raises(GrammarError, match="outlines grammar backend does not support ebnf"):
        outlines.compile("ebnf", ARITH)
    with pytest.raises(GrammarError, match="does not support json_object"):
        outlines.compile("json_object", "")
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}
    with pytest.raises(GrammarError, match=r"cannot enforce 'minimum' \(at /properties/n\)"):
        outlines.compile("json_schema", json.dumps(bounded))
    pattern_len = {"type": "string", "pattern": "[a-z]+", "minLength": 2}
    with pytest.raises(GrammarError, match="pattern with minLength"):
        outlines.compile("json_schema", json.dumps(pattern_len))


@pytest.mark.parametrize("name", BACKENDS)
def test_choices_prefer_no_alternative(build, encode, name):
    """'yes' must not hide 'yes please' (outlines' leftmost-first alternation)."""
    for text in ("yes", "yes please", "no"):
        g = build(name, "choices", ["yes", "yes please", "no"])
        assert g.accept_tokens(encode(text)) == len(encode(text)), text
        assert g.accept_token(EOS)


@pytest.mark.parametrize("name", BACKENDS)
def test_jump_forward_string_after_brace(build, encode, name):
    grammar = build(name, "json_schema", PERSON)
    assert grammar.find_jump_forward_string().startswith("{")
    grammar.accept_tokens(encode("{"))
    assert grammar.find_jump_forward_string() == '"name":"'
    grammar.accept_tokens(encode('"name":"Bob"'))
    assert grammar.find_jump_forward_string() == ',"age":'
    grammar.accept_tokens(encode(',"age":4'))
    assert grammar.find_jump_forward_string() == ""  # more digits or "}"


@pytest.mark.parametrize("name", BACKENDS)
def test_rollback_and_copy(build, encode, name):
    grammar = build(name, "json_schema", PERSON)
    head = encode('{"name":"')
    grammar.accept_tokens(head)
    at_string = mask_of(grammar)
    twin = grammar.copy()
    tail = encode('Bob","age":')
    assert grammar.accept_tokens(tail) == len(tail)
    assert not (mask_of(grammar) == at_string).all()
    assert (mask_of(twin) == at_string).all(), "a copy must not follow its original"
    grammar.rollback(len(tail))
    assert (mask_of(grammar) == at_string).all()
    assert twin.accept_tokens(tail) == len(tail)
    assert twin.accept_tokens(encode("7}")) == 2 and twin.accept_token(EOS)
    assert twin.is_terminated() and not grammar.is_terminated()
    twin.rollback(1)  # undo EOS
    assert not twin.is_terminated() and EOS in allowed_ids(mask_of(twin))


def test_xgrammar_compact_json_by_default_and_whitespace_when_configured(vocab, encode):
    from radixgen.runtime.constrained.xgrammar_backend import XGrammarBackend
    from radixgen.server_args import GrammarConfig

    spaced = '{ "name": "Bob", "age": 1 }'
    compact = XGrammarBackend(vocab, GrammarConfig())
    g = compact.create_grammar(compact.compile("json_schema", json.dumps(PERSON)))
    assert g.accept_tokens(encode(spaced)) < len(encode(spaced))
    loose = XGrammarBackend(vocab, GrammarConfig(constrained_json_whitespace_pattern=r"[ ]?"))
    g = loose.create_grammar(loose.compile("json_schema", json.dumps(PERSON)))
    assert g.accept_tokens(encode(spaced)) == len(encode(spaced))


def test_xgrammar_refuses_pattern_with_length(backends):
    """xgrammar keeps the pattern and drops min/maxLength: refuse rather than over-long strings."""
    schema = {
        "type": "object",
        "properties": {"c": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}},
    }
    with pytest.raises(
        GrammarError, match=r"xgrammar .* 'pattern with minLength/maxLength' \(at /properties/c\)"
    ):
        backends["xgrammar"].compile("json_schema", json.dumps(schema))
    backends["llguidance"].compile("json_schema", json.dumps(schema))  # llguidance enforces both


def test_xgrammar_strict_mode_forbids_undeclared_keys(build, encode):
    g = build("xgrammar", "json_schema", PERSON)
    extra = '{"name":"A","age":1,"x'
    assert g.accept_tokens(encode(extra)) < len(encode(extra))


@pytest.mark.parametrize(
    ("keyword", "schema"),
    [
        ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
        ("not", {"type": "object", "properties": {"a": {"not": {"type": "integer"}}}}),
        (  # 2^5 anyOf branches once rewritten: over the rewrite's bound
            "dependentRequired",
            {"type": "object", "dependentRequired": {f"p{i}": ["q"] for i in range(5)}},
        ),
        (  # "not this string" has no positive form, so `if` has no exact rewrite
            "if",
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "if": {"properties": {"a": {"const": "x"}}},
                "then": {"required": ["b"]},
            },
        ),
        ("contains", {"type": "array", "contains": {"const": 5}}),
        ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 5}]}),
    ],
)
def test_xgrammar_refuses_keywords_it_would_not_enforce(compiled, keyword, schema):
    """Measured: xgrammar's converter lets instances violating these through, so they are refused
    by name instead of served unenforced, unless the checked layer validates them (then the
    relaxed schema compiles, and the scheduler checks the values: schema_checks.py)."""
    try:
        plan = plan_checks(rewrite_schema(schema).schema)
    except GrammarError:  # a rewrite over its bound: refused before any check
        plan = None
    if plan is not None and keyword in plan.keywords:
        compiled("xgrammar", "json_schema", json.dumps(schema))
        return
    with pytest.raises(GrammarError, match=f"cannot enforce '{keyword}'"):
        compiled("xgrammar", "json_schema", json.dumps(schema))


def test_xgrammar_serves_a_single_subschema_allof(build, encode):
    """pydantic wraps a described $ref in a one-item allOf: that is just the subschema."""
    schema = {
        "type": "object",
        "properties": {"n": {"allOf": [{"type": "integer"}], "description": "a count"}},
        "required": ["n"],
    }
    grammar = build("xgrammar", "json_schema", schema)
    assert grammar.accept_tokens(encode('{"n":3}')) == len(encode('{"n":3}'))
