"""Which JSON-schema features each grammar backend enforces exactly, and which backend serves a schema.

Runs in the scheduler process (backend choice, on the scheduler thread) and in the compile
workers (each backend refuses its own gaps again before compiling). "Exactly" means every output
the backend's mask lets through validates against the schema; a backend may be stricter than the
schema (fixed property order, no extra keys) but never looser. The gap tables below are data,
audited by measurement in test/constrained/test_schema_support.py: for each gap an instance
violating the keyword passes that backend's mask (or the library refuses the keyword), and for
each feature not listed, violating instances are blocked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixgen.errors import GrammarError
from radixgen.json_types import JSONValue
from radixgen.runtime.constrained.grammar_spec import subschemas
from radixgen.runtime.constrained.schema_merge import (
    dict_field,
    is_json_type,
    list_field,
    resolve_pointer,
    schema_objects,
)
from radixgen.runtime.constrained.schema_rewrite import rewrite_schema

# keywords that constrain one JSON type only (xgrammar drops them when "type" is absent)
_TYPED_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength"}
    | {"maxLength", "pattern", "format", "minItems", "maxItems", "minProperties", "maxProperties"}
)

# keywords that only annotate: they never make an instance invalid
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "id", "$comment", "$defs", "definitions", "title", "description"}
    | {
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$anchor",
        "markdownDescription",
    }
)

# Gaps shared by every backend here: accepted-and-ignored, or refused by the library. (not, if
# and the dependency keywords reach the tables only in forms schema_rewrite.py cannot rewrite;
# these, uniqueItems, contains and overlapping oneOf are then served by the checked layer,
# schema_checks.py, which drops them from the compiled schema and validates them at run time.
# The tables still say what the masks alone enforce: `schema_plan` is that choice.)
_NO_BACKEND = frozenset(
    {
        "not",
        "if",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "oneOf",  # only when the branches are not provably disjoint (see _one_of_disjoint)
    }
)

# Per backend: the features it cannot enforce exactly (names as they appear in messages).
# xgrammar 0.2.9 (measured): fails on a property schema `false` (for rewritten schemas
# drop_false_properties drops it where the object is closed, which says the same; not beside an
# additionalProperties schema); ignores allOf, required names missing from properties, keywords
# beside $ref, the length bounds of a patterned string, $refs that are not "#/..." pointers, and
# numeric/string/array bounds in a subschema without "type"; fails on draft-4 array `items` and
# boolean exclusiveMinimum/Maximum; serves an anyOf/oneOf alone, ignoring the keywords beside it,
# and an enum/const alone, ignoring those beside it (schema_rewrite.py merges them into the
# branches and cuts an enum to its type where that is exact); patternProperties it serves as "no such keys" beside
# "type": "object" but not without it (listed: a gap in some uses). unevaluated* it serves
# strictly (no key or item beyond the listed ones, which is valid).
# llguidance 1.9.1 (measured): refuses propertyNames and unevaluatedProperties by name; serves
# disjoint oneOf with coerce_one_of; unknown `format`s are removed before it sees them (they are
# annotations in JSON Schema 2019-09 and later, and ignored by validators of earlier drafts).
SCHEMA_GAPS: dict[str, frozenset[str]] = {
    "xgrammar": _NO_BACKEND
    | {
        "allOf",
        "required (a name not in properties)",
        "$ref with sibling keywords",
        "$ref (not a local #/ pointer)",
        "patternProperties",
        "pattern with minLength/maxLength",
        "items (array form)",
        "exclusiveMinimum/exclusiveMaximum (boolean form)",
        "a type-specific keyword without type",
        "a property schema false (beside additionalProperties)",
        "keywords beside anyOf/oneOf",
        "keywords beside enum/const",
    },
    "llguidance": _NO_BACKEND | {"propertyNames", "unevaluatedProperties", "unevaluatedItems"},
}

# formats llguidance 1.9.1 checks; it refuses any other name, so others are dropped for it
LLGUIDANCE_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"}
)

_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contains",
)


@dataclass(frozen=True)
class SchemaGap:
    """A feature some backend cannot enforce, and where in the schema it is (JSON pointer)."""

    feature: str
    path: str

    def __str__(self) -> str:
        return f"'{self.feature}' (at {self.path or '/'})"


def schema_features(root: JSONValue) -> list[SchemaGap]:
    """Every gap-table feature used by the parts of `root` that validation can reach.

    Local $refs are followed (once each); definitions nothing refers to are not looked at.
    """
    found: list[SchemaGap] = []
    seen: set[str] = set()
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, schema = stack.pop()
        if not isinstance(schema, dict):
            continue
        found.extend(SchemaGap(f, path) for f in _features_here(root, schema))
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
            seen.add(ref)
            stack.append((ref[1:], resolve_pointer(root, ref)))
        stack.extend(reversed(_children(path, schema)))
    return found


def backend_gaps(
    schema: JSONValue, features: list[SchemaGap] | None = None
) -> dict[str, list[SchemaGap]]:
    """For each backend with a gap table: the gaps this schema hits (empty: it serves exactly)."""
    features = schema_features(schema) if features is None else features
    return {name: [g for g in features if g.feature in gaps] for name, gaps in SCHEMA_GAPS.items()}


def refuse_gaps(backend: str, schema: JSONValue) -> None:
    """Raise a 400 naming the features of `schema` that `backend` would not enforce."""
    gaps = backend_gaps(schema)[backend]
    if gaps:
        raise GrammarError(
            f"the {backend} grammar backend cannot enforce {_listing(gaps)} in json_schema",
            "json_schema",
        )


def choose_schema_backend(spec: str, order: list[str]) -> str:
    """The first backend of `order` that enforces the schema exactly; else a 400 naming why."""
    return schema_backends(spec, order)[0]


def schema_backends(spec: str, order: list[str]) -> list[str]:
    """The backends of `order` that enforce the schema exactly, in order; none: a 400 naming why."""
    return schema_plan(spec, order)[0]


def schema_plan(spec: str, order: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """`schema_backends`, and the exact rewrites (schema_rewrite.py) the backends will apply.

    The gaps are those of the rewritten schema, which is what the backends compile. A spec that
    is not JSON goes to the first backend, whose compile reports the error.
    """
    try:
        raw = json.loads(spec)
    except ValueError:
        return order[:1], ()
    rewritten = rewrite_schema(raw)  # past its branch bound: a 400 naming the keyword
    by_backend = backend_gaps(rewritten.schema)
    # backends without a table (outlines) refuse their own gaps when they compile
    exact = [name for name in order if not by_backend.get(name, [])]
    if exact:
        return exact, rewritten.rewrites
    tried = [n for n in order if n in by_backend]
    common = [g for g in by_backend[tried[0]] if all(g in by_backend[n] for n in tried)]
    if common:
        why = f"uses {_listing(common)}, which no grammar backend here enforces"
    else:
        why = "needs features no single backend enforces: " + "; ".join(
            f"{n} cannot enforce {_listing(by_backend[n])}" for n in tried
        )
    raise GrammarError(f"json_schema {why}", "json_schema")


def strip_unknown_formats(schema: Any, known: frozenset[str]) -> Any:
    """A copy of the schema without `format` values outside `known` (annotations only)."""
    if isinstance(schema, list):
        return [strip_unknown_formats(s, known) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "format" and isinstance(value, str) and value not in known:
            continue
        if key in ("enum", "const", "default", "examples"):
            out[key] = value  # instance data, not schemas
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: strip_unknown_formats(v, known) for k, v in value.items()}
        else:
            out[key] = strip_unknown_formats(value, known)
    return out


def close_objects(schema: Any, part: bool = False) -> Any:
    """A copy where an object subschema without `additionalProperties` gets `false`.

    xgrammar's strict mode does the same: the small model otherwise invents keys until its
    token limit. It only narrows what is allowed (every output still validates), and it is
    skipped where it could exclude every instance: beside allOf/anyOf/oneOf/$ref, in an allOf
    branch or an anyOf/oneOf branch of a schema with its own properties (`part`: another part
    may declare the keys), in a subschema a `$ref` in such a branch names (closing
    `{"allOf": [{"$ref": "#/definitions/person"}, {"required": ["club"]}]}`'s person would
    leave no instance), with patternProperties, or when a required name is not declared.
    """
    return _close(schema, part, "#", _part_refs(schema))


def _part_refs(root: JSONValue) -> frozenset[str]:
    """The local pointers a `$ref` in a part position names (and those they name in turn)."""
    found: set[str] = set()
    for node in schema_objects(root):
        for key in ("allOf", "anyOf", "oneOf"):
            parts = node.get(key)
            if isinstance(parts, list) and (
                key == "allOf" or isinstance(node.get("properties"), dict)
            ):
                for b in parts:
                    ref = b.get("$ref") if isinstance(b, dict) else None
                    if isinstance(ref, str):
                        found.add(ref)
    todo = list(found)
    while todo:  # a named subschema that is itself a $ref: what that names is a part too
        ref = todo.pop()
        target = resolve_pointer(root, ref) if ref.startswith("#") else None
        if isinstance(target, dict):
            named = target.get("$ref")
            if isinstance(named, str) and named not in found:
                found.add(named)
                todo.append(named)
    return frozenset(found)


def _close(schema: JSONValue, part: bool, pointer: str, shared_refs: frozenset[str]) -> JSONValue:
    if isinstance(schema, list):
        return [_close(s, False, f"{pointer}/{i}", shared_refs) for i, s in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    part = part or pointer in shared_refs
    out: dict[str, JSONValue] = {}
    for key, value in schema.items():
        here = f"{pointer}/{_escape(key)}"
        if key in ("enum", "const", "default", "examples"):
            out[key] = value
        elif key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            out[key] = (
                {k: _close(v, False, f"{here}/{_escape(k)}", shared_refs) for k, v in value.items()}
                if isinstance(value, dict)
                else value
            )
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
            shared = key == "allOf" or isinstance(schema.get("properties"), dict)
            out[key] = [_close(v, shared, f"{here}/{i}", shared_refs) for i, v in enumerate(value)]
        else:
            out[key] = _close(value, False, here, shared_refs)
    props = schema.get("properties")
    required = list_field(schema, "required")
    is_object = schema.get("type") == "object" or (isinstance(props, dict) and "type" not in schema)
    if (
        is_object
        and not part
        and "additionalProperties" not in schema
        and not {"patternProperties", "allOf", "anyOf", "oneOf", "$ref"} & schema.keys()
        and all(isinstance(props, dict) and name in props for name in required)
    ):
        out["additionalProperties"] = False
    return out


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def drop_false_properties(schema: Any) -> Any:
    """A copy without `properties` entries `false` where the object admits no other names.

    xgrammar fails on a `false` subschema; in an object closed by additionalProperties (false,
    or absent: its strict mode closes it), a name left out of `properties` is as forbidden as
    one declared `false`. Elsewhere the entry stays (a gap: the schema goes to llguidance).
    """
    if isinstance(schema, list):
        return [drop_false_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("enum", "const", "default", "examples"):
            out[key] = value
        elif key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(
            value, dict
        ):
            out[key] = {k: drop_false_properties(v) for k, v in value.items()}
        else:
            out[key] = drop_false_properties(value)
    props = out.get("properties")
    if isinstance(props, dict) and not _false_property_kept(schema):
        out["properties"] = {k: v for k, v in props.items() if v is not False}
    return out


def _false_property_kept(s: dict[str, Any]) -> bool:
    """Whether a `false` property of `s` must stay (dropping it would admit the name)."""
    props = s.get("properties")
    if not isinstance(props, dict) or not any(v is False for v in props.values()):
        return False
    required = list_field(s, "required")
    return (
        s.get("additionalProperties", False) is not False
        or bool(s.get("patternProperties"))
        or any(props.get(n) is False for n in required)
    )


def _listing(gaps: list[SchemaGap]) -> str:
    shown = [str(g) for g in gaps[:4]]
    more = f" and {len(gaps) - 4} more" if len(gaps) > 4 else ""
    return ", ".join(shown) + more


def _validation_keys(schema: dict[str, Any]) -> set[str]:
    return {k for k in schema if k not in _ANNOTATIONS}


def _features_here(root: Any, s: dict[str, Any]) -> list[str]:
    """The gap-table features this one subschema uses (not its children's)."""
    out: list[str] = []
    for kw in _NO_BACKEND - {"oneOf", "if", "uniqueItems"}:  # (set order: sorted for messages)
        if kw in s:
            out.append(kw)
    if "if" in s and ("then" in s or "else" in s):  # a lone "if" constrains nothing
        out.append("if")
    max_items = s.get("maxItems")
    if s.get("uniqueItems") is True and not (isinstance(max_items, int) and max_items <= 1):
        out.append("uniqueItems")
    if isinstance(s.get("oneOf"), list) and not _one_of_disjoint(root, s["oneOf"]):
        out.append("oneOf")
    all_of = s.get("allOf")
    if isinstance(all_of, list) and (len(all_of) > 1 or _validation_keys(s) - {"allOf"}):
        out.append("allOf")
    ref = s.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#"):
            out.append("$ref (not a local #/ pointer)")
        if _validation_keys(s) - {"$ref"}:
            out.append("$ref with sibling keywords")
    props = dict_field(s, "properties")
    required = s.get("required")
    if isinstance(required, list) and any(name not in props for name in required):
        out.append("required (a name not in properties)")
    if s.get("patternProperties"):
        out.append("patternProperties")
    if "pattern" in s and ("minLength" in s or "maxLength" in s):
        out.append("pattern with minLength/maxLength")
    if isinstance(s.get("items"), list):
        out.append("items (array form)")
    if isinstance(s.get("exclusiveMinimum"), bool) or isinstance(s.get("exclusiveMaximum"), bool):
        out.append("exclusiveMinimum/exclusiveMaximum (boolean form)")
    for kw in ("unevaluatedProperties", "unevaluatedItems"):
        if kw in s:
            out.append(kw)
    if not {"type", "enum", "const"} & s.keys() and _TYPED_KEYWORDS & s.keys():
        out.append("a type-specific keyword without type")
    if "propertyNames" in s:
        out.append("propertyNames")
    if _false_property_kept(s):
        out.append("a property schema false (beside additionalProperties)")
    combined = {k for k in ("anyOf", "oneOf") if isinstance(s.get(k), list)}
    if (combined and _validation_keys(s) - combined) or len(combined) > 1:
        out.append("keywords beside anyOf/oneOf")
    if _enum_beside_keywords(s):
        out.append("keywords beside enum/const")
    return out


def _enum_beside_keywords(s: dict[str, Any]) -> bool:
    """An enum/const with another keyword that could reject one of its values (a `type` all
    the values meet rejects none)."""
    values = _values(s)
    if values is None:
        return False
    if ("const" in s and "enum" in s) or _validation_keys(s) - {"enum", "const", "type"}:
        return True
    if "type" not in s:
        return False
    names = [s["type"]] if isinstance(s["type"], str) else s["type"]
    if not isinstance(names, list):
        return True
    items = [s["const"]] if "const" in s else s["enum"]
    return not all(any(is_json_type(v, t) for t in names) for v in items)


def _children(path: str, schema: dict[str, Any]) -> list[tuple[str, Any]]:
    return subschemas(path, schema, _SCHEMA_MAPS, _SCHEMA_LISTS, _SCHEMA_VALUES)


# --- oneOf: served as anyOf, which is exact only when no instance matches two branches ------------

_ALL_TYPES = frozenset({"object", "array", "string", "number", "boolean", "null"})


def _deref(root: Any, s: Any, depth: int = 0) -> Any:
    while isinstance(s, dict) and isinstance(s.get("$ref"), str) and depth < 16:
        if not s["$ref"].startswith("#") or _validation_keys(s) - {"$ref"}:
            return s
        s, depth = resolve_pointer(root, s["$ref"]), depth + 1
    return s


def _types(root: Any, s: Any, depth: int = 0) -> frozenset[str]:
    """The JSON types a branch admits at most ("integer" counts as "number")."""
    s = _deref(root, s)
    if s is False:
        return frozenset()
    if not isinstance(s, dict) or depth > 8:
        return _ALL_TYPES
    t = s.get("type")
    names = [t] if isinstance(t, str) else t if isinstance(t, list) else None
    values = _values(s)
    out = _ALL_TYPES
    if names is not None:
        out = frozenset("number" if n == "integer" else n for n in names) & _ALL_TYPES
    if values is not None:
        out &= frozenset(_type_of(v) for v in values)
    all_of = s.get("allOf")
    for sub in all_of if isinstance(all_of, list) else []:
        out &= _types(root, sub, depth + 1)
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            out &= frozenset().union(*(_types(root, b, depth + 1) for b in s[key]))
    return out


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _values(s: Any) -> set[str] | None:
    """The instances a const/enum branch allows, in a canonical text form (None: not fixed)."""
    if not isinstance(s, dict):
        return None
    if "const" in s:
        items = [s["const"]]
    elif isinstance(s.get("enum"), list):
        items = s["enum"]
    else:
        return None
    return {_canonical(v) for v in items}


def _canonical(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # 1 and 1.0 are the same JSON Schema number
    return json.dumps(v, sort_keys=True)


def _one_of_disjoint(root: Any, branches: list[Any]) -> bool:
    """True when no instance can match two branches (checked pairwise, conservatively)."""
    subs = [_deref(root, b) for b in branches]
    if not all(isinstance(b, dict) for b in subs):
        return False
    return all(_pair_disjoint(root, a, b) for i, a in enumerate(subs) for b in subs[i + 1 :])


def _pair_disjoint(root: Any, a: dict[str, Any], b: dict[str, Any]) -> bool:
    both = _types(root, a) & _types(root, b)
    if not both:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None:
        return not (va & vb)
    if both != {"object"}:
        return False
    # objects: a property both require whose fixed values differ (a discriminator)
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    ra, rb = set(a.get("required") or []), set(b.get("required") or [])
    for name in ra & rb:
        xa, xb = _values(_deref(root, pa.get(name))), _values(_deref(root, pb.get(name)))
        if xa is not None and xb is not None and not (xa & xb):
            return True
    # a name one requires that the other, a closed object, cannot have
    for x, y, py in ((a, b, pb), (b, a, pa)):
        closed = y.get("additionalProperties") is False and not y.get("patternProperties")
        if closed and any(name not in py for name in x.get("required") or []):
            return True
    return False
