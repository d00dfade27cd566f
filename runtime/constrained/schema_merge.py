"""Exact merge of two JSON schemas into one (their allOf), where the merge is plain data.

Used by the schema rewrites (schema_rewrite.py): xgrammar ignores `allOf`, and `anyOf` beside
`properties`, so a rewritten node's own keywords are merged into each of its anyOf branches.
`merge_schemas` returns a schema valid for exactly the instances valid under both, or None
where it cannot say so without `allOf` (then the caller keeps the allOf), or UNSATISFIABLE.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from radixgen.json_types import JSONValue

_ANNOTATIONS = frozenset(
    {"$schema", "$id", "id", "$comment", "title", "description", "default", "examples"}
    | {"deprecated", "readOnly", "writeOnly", "markdownDescription"}
)
_LOWER_BOUNDS = frozenset({"minimum", "minLength", "minItems", "minProperties"})
_UPPER_BOUNDS = frozenset({"maximum", "maxLength", "maxItems", "maxProperties"})
_OBJECT_GROUP = ("properties", "patternProperties", "additionalProperties")
# keywords read together: both sides may use one group only with the same values
_GROUPS = (
    frozenset({"items", "additionalItems", "prefixItems"}),
    frozenset({"contains", "minContains", "maxContains"}),
    frozenset({"if", "then", "else"}),
)
# keywords whose meaning depends on what the other side evaluates, or on nothing merged
_NOT_MERGED = frozenset({"$ref", "$dynamicRef", "unevaluatedProperties", "unevaluatedItems"})


def dict_field(s: dict[str, Any], key: str) -> dict[str, Any]:
    """`s[key]` where it is an object, else {} (a malformed value reads as absent)."""
    value = s.get(key)
    return value if isinstance(value, dict) else {}


def list_field(s: dict[str, Any], key: str) -> list[Any]:
    """`s[key]` where it is an array, else []."""
    value = s.get(key)
    return value if isinstance(value, list) else []


class _Unsatisfiable:
    """No instance is valid (the merged branch can be dropped)."""

    def __repr__(self) -> str:
        return "UNSATISFIABLE"


UNSATISFIABLE: Any = _Unsatisfiable()


def merge_schemas(a: Any, b: Any) -> Any:
    """A schema equal to allOf[a, b]; None when no merge is known, or UNSATISFIABLE."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return UNSATISFIABLE
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    if _NOT_MERGED & (a.keys() | b.keys()) or _bool_exclusive(a, b):
        return None
    for group in _GROUPS:
        ga, gb = {k: a[k] for k in group if k in a}, {k: b[k] for k in group if k in b}
        if ga and gb and ga != gb:
            return None
    out = {k: v for k, v in a.items() if k not in _OBJECT_GROUP}
    for key, bv in b.items():
        if key in _OBJECT_GROUP:
            continue
        if key not in out or out[key] == bv or key in _ANNOTATIONS:
            out.setdefault(key, bv)
            continue
        merged = _merge_keyword(key, out[key], bv)
        if merged is None or merged is UNSATISFIABLE:
            return merged
        out[key] = merged
    objects = _merge_object_keywords(a, b)
    if objects is None:
        return None
    out.update(objects)
    if "const" in out and isinstance(out.get("enum"), list):  # one list: a backend may read one
        left = [v for v in out.pop("enum") if canonical(v) == canonical(out["const"])]
        if not left:
            return UNSATISFIABLE
    if not _values_fit_type(out) or not _numbers_fit_bounds(out):
        return UNSATISFIABLE
    return UNSATISFIABLE if _required_absent(out) else out


def _numbers_fit_bounds(s: dict[str, Any]) -> bool:
    """When the merged bounds leave no number, take the numeric types out of `type` (libraries
    fail on an empty range: xgrammar measured); False: no type is left."""
    lows = [(s[k], k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum") if k in s]
    highs = [(s[k], k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum") if k in s]
    if not lows or not highs or not all(_is_number(v) for v, _ in lows + highs):
        return True
    lo, lo_open = max(lows, key=lambda b: (b[0], b[1]))
    hi, hi_open = min(highs, key=lambda b: (b[0], not b[1]))
    names = [s["type"]] if isinstance(s.get("type"), str) else s.get("type")
    if names is None:
        names = ["null", "boolean", "object", "array", "string", "number"]
    elif not isinstance(names, list):
        return True
    if "number" in names:
        empty = lo > hi or (lo == hi and (lo_open or hi_open))
        drop = {"number", "integer"} if empty else set()
    else:
        first = math.floor(lo) + 1 if lo_open or not float(lo).is_integer() else int(lo)
        last = math.ceil(hi) - 1 if hi_open or not float(hi).is_integer() else int(hi)
        drop = {"integer"} if first > last else set()
    if not drop or not drop & set(names):
        return True
    left = [t for t in names if t not in drop]
    for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        s.pop(k, None)  # only numbers read them
    if left:
        s["type"] = left[0] if len(left) == 1 else left
    return bool(left)


def _values_fit_type(s: dict[str, Any]) -> bool:
    """Drop enum values outside `type` (xgrammar reads the enum alone: measured, it lets a
    string of `"type": "integer", "enum": [1, "x"]` through); False: none is left."""
    names = [s["type"]] if isinstance(s.get("type"), str) else s.get("type")
    if not isinstance(names, list):
        return True
    if "const" in s:
        return any(is_json_type(s["const"], t) for t in names)
    if isinstance(s.get("enum"), list):
        s["enum"] = [v for v in s["enum"] if any(is_json_type(v, t) for t in names)]
        return bool(s["enum"])
    return True


def _merge_keyword(key: str, av: Any, bv: Any) -> Any:
    if key == "type":
        return _merge_types(av, bv)
    if key == "required" and isinstance(av, list) and isinstance(bv, list):
        return av + [n for n in bv if n not in av]
    if key == "enum" and isinstance(av, list) and isinstance(bv, list):
        keys = {canonical(v) for v in bv}
        both = [v for v in av if canonical(v) in keys]
        return both if both else UNSATISFIABLE
    if key == "const":
        return av if canonical(av) == canonical(bv) else UNSATISFIABLE
    if key == "allOf" and isinstance(av, list) and isinstance(bv, list):
        return av + bv
    if key == "uniqueItems" and isinstance(av, bool) and isinstance(bv, bool):
        return av or bv
    if _is_number(av) and _is_number(bv):
        if key in _LOWER_BOUNDS or key == "exclusiveMinimum":
            return max(av, bv)
        if key in _UPPER_BOUNDS or key == "exclusiveMaximum":
            return min(av, bv)
    return None


def _merge_types(av: Any, bv: Any) -> Any:
    ta = [av] if isinstance(av, str) else av
    tb = [bv] if isinstance(bv, str) else bv
    if not isinstance(ta, list) or not isinstance(tb, list):
        return None
    out = []
    for t in ta:
        if t in tb or (t == "integer" and "number" in tb):
            out.append(t)
        elif t == "number" and "integer" in tb:
            out.append("integer")
    out = list(dict.fromkeys(out))
    if not out:
        return UNSATISFIABLE
    return out[0] if len(out) == 1 else out


def _merge_object_keywords(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """properties / additionalProperties of both: a name one side lists and the other does not
    gets the other side's additionalProperties (its schema for names it does not list)."""
    ga = {k: a[k] for k in _OBJECT_GROUP if k in a}
    gb = {k: b[k] for k in _OBJECT_GROUP if k in b}
    if not ga or not gb or ga == gb:
        return ga or gb
    if "patternProperties" in ga or "patternProperties" in gb:
        return None  # a listed name may match the other side's patterns: not plain data
    pa, pb = ga.get("properties", {}), gb.get("properties", {})
    if not isinstance(pa, dict) or not isinstance(pb, dict):
        return None
    add_a, add_b = ga.get("additionalProperties", True), gb.get("additionalProperties", True)
    props = {}
    for name in [*pa, *(n for n in pb if n not in pa)]:
        props[name] = _merge_sub(pa.get(name, add_a), pb.get(name, add_b))
    out: dict[str, Any] = {"properties": props} if props else {}
    if "additionalProperties" in ga or "additionalProperties" in gb:
        out["additionalProperties"] = _merge_sub(add_a, add_b)
    return out


def _merge_sub(x: Any, y: Any) -> Any:
    """A subschema of both; unsatisfiable is `false` (for a property: it must be absent)."""
    merged = merge_schemas(x, y)
    if merged is UNSATISFIABLE:
        return False
    return {"allOf": [x, y]} if merged is None else merged


def _required_absent(s: dict[str, Any]) -> bool:
    """An object-only schema that requires a name its `properties` forbid."""
    props = dict_field(s, "properties")
    required = list_field(s, "required")
    other = s.get("additionalProperties", True)
    object_only = s.get("type") in ("object", ["object"])
    return object_only and any(props.get(n, other) is False for n in required)


def _bool_exclusive(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Draft 4's boolean exclusiveMinimum/Maximum reads the sibling bound: merge neither."""
    return any(
        isinstance(s.get(k), bool) for s in (a, b) for k in ("exclusiveMinimum", "exclusiveMaximum")
    )


def is_json_type(value: Any, t: str) -> bool:
    """Whether a JSON value is of the JSON-schema type `t` (2.0 is an integer, true is not)."""
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return _is_number(value) and float(value).is_integer()
    if t == "number":
        return _is_number(value)
    if t == "string":
        return isinstance(value, str)
    return isinstance(value, list) if t == "array" else isinstance(value, dict)


def canonical(v: Any) -> str:
    """A value's text for JSON-schema equality (1 and 1.0 are the same number)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return json.dumps(v, sort_keys=True)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def schema_objects(root: JSONValue) -> Iterator[dict[str, JSONValue]]:
    """Every JSON object of a schema document, subschemas and keyword maps alike (what `enum`,
    `const`, `default` and `examples` hold is instance data: not walked)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            yield node
            stack.extend(v for k, v in node.items() if k not in _INSTANCE_DATA)


_INSTANCE_DATA = frozenset({"enum", "const", "default", "examples"})


def resolve_pointer(root: JSONValue, ref: str) -> JSONValue:
    """The subschema a local "#/a/b" pointer names (None when it names nothing)."""
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
