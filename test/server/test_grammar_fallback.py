"""Per-request grammar backend choice over real HTTP (the shared server's default: xgrammar).

A schema xgrammar cannot enforce exactly is served by llguidance, and meta_info says so; one no
backend enforces (nor the checked layer validates) gets a 400 naming the keyword; a checked
keyword is served and named in meta_info.schema_checks; a batch mixing both backends decodes
together; a schema served after exact rewrites says which in meta_info.schema_rewrites.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema

from .conftest import needs_grammar

SLUG = {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 6}
# NOTE: closed explicitly (as the llguidance backend would close it anyway): the small model
# otherwise invents keys until the token limit
LLG_SCHEMA = {
    "type": "object",
    "properties": {"slug": SLUG},
    "required": ["slug"],
    "additionalProperties": False,
}
XGR_SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
}
# `b` is required but not declared in properties: xgrammar would not enforce it
LLG_REQUIRED = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": {"type": "integer"},
}


def _generate(http: httpx.Client, schema: dict, text: str = "JSON: ", **extra) -> httpx.Response:
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 48, "temperature": 0, **extra}
    return http.post("/generate", json={"text": text, "sampling_params": params})


def _valid(schema: dict, out: dict) -> None:
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    jsonschema.validate(json.loads(out["text"]), schema)


@needs_grammar
def test_schema_xgrammar_cannot_enforce_is_served_by_llguidance(http):
    r = _generate(http, LLG_SCHEMA, "A short lowercase slug as JSON: ")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["grammar_backend"] == "llguidance"
    _valid(LLG_SCHEMA, out)
    plain = _generate(http, XGR_SCHEMA).json()
    assert plain["meta_info"]["grammar_backend"] == "xgrammar"
    _valid(XGR_SCHEMA, plain)
    free = http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}})
    assert "grammar_backend" not in free.json()["meta_info"]


@needs_grammar
def test_schema_no_backend_enforces_is_a_400_naming_the_keyword(http):
    # a gap of each backend (xgrammar: `b` not declared; llguidance: propertyNames) that the
    # checked layer does not validate
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a", "b"],
        "propertyNames": {"maxLength": 1},
    }
    r = _generate(http, schema)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "'propertyNames'" in message and "'required (a name not in properties)'" in message
    assert http.get("/health").status_code == 200


@needs_grammar
def test_checked_keyword_is_served_and_meta_info_names_the_check(http):
    """uniqueItems: no backend's mask enforces it; the checked layer validates each item."""
    schema = {
        "type": "array",
        "items": {"type": "integer", "minimum": 1, "maximum": 9},
        "minItems": 4,
        "maxItems": 4,
        "uniqueItems": True,
    }
    r = _generate(http, schema, "The list 1, 1, 1, 1 as JSON: ")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["schema_checks"] == ["uniqueItems"]
    assert out["meta_info"]["schema_check_rollbacks"] >= 0
    _valid(schema, out)
    assert "schema_checks" not in _generate(http, XGR_SCHEMA).json()["meta_info"]


@needs_grammar
def test_mixed_backends_in_one_batch_all_valid(http):
    """Requests of both backends in flight together (one batch call plus concurrent singles):
    each backend fills its own mask rows in the same steps."""
    schemas = [XGR_SCHEMA, LLG_SCHEMA, LLG_REQUIRED, XGR_SCHEMA, LLG_SCHEMA, LLG_REQUIRED]
    batch = {
        "text": [f"Item {i} as JSON: " for i in range(len(schemas))],
        "sampling_params": [
            {"json_schema": json.dumps(s), "max_new_tokens": 64, "temperature": 0} for s in schemas
        ],
    }
    with ThreadPoolExecutor(4) as pool:
        singles = [
            pool.submit(_generate, http, s, f"Record {i}: ", max_new_tokens=64)
            for i, s in enumerate(schemas[:3])
        ]
        outs = http.post("/generate", json=batch)
        assert outs.status_code == 200, outs.text
        results = list(zip(schemas, outs.json(), strict=True))
        results += [(s, f.result().json()) for s, f in zip(schemas[:3], singles, strict=True)]
    for schema, out in results:
        want = "xgrammar" if schema is XGR_SCHEMA else "llguidance"
        assert out["meta_info"]["grammar_backend"] == want
        _valid(schema, out)


# `a` and `b` not both, and `b` brings `n`: served by xgrammar after exact rewrites
REWRITTEN = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "n": {"type": "integer"}},
    "not": {"required": ["a", "b"]},
    "dependentRequired": {"b": ["n"]},
}


@needs_grammar
def test_rewritten_schema_is_served_and_meta_info_names_the_rewrites(http):
    r = _generate(http, REWRITTEN, "Two numbers as JSON: ")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["schema_rewrites"] == ["dependentRequired", "not:required"]
    assert out["meta_info"]["grammar_backend"] == "xgrammar"
    _valid(REWRITTEN, out)
    assert "schema_rewrites" not in _generate(http, XGR_SCHEMA).json()["meta_info"]
