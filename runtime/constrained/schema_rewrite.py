"""Exact rewrites of JSON-schema keywords no grammar backend enforces into ones they do.

Runs in the scheduler process (backend choice, `meta_info`) and in the compile workers (the
backends compile the rewritten schema). Each rewrite keeps the set of valid instances exactly
(proven against `jsonschema` in test/constrained/test_schema_rewrite.py):

- `not` of `type`, `required`, `enum`/`const`, `properties`, `anyOf`/`allOf`/`not` of those,
  where the complement has a positive form in the node's context (e.g. "not this string" has
  none, so it stays refused);
- `dependencies`, `dependentRequired`, `dependentSchemas`: per trigger, "absent, or present
  with the dependency";
- `if`/`then`/`else`: `(if and then) or (not if and else)`, when `not if` has a positive form;
- `$ref`s to another resource of the same bundle (`$id`, anchors): root pointers; before
  2019-09, the keywords a `$ref` overrides dropped; root definitions no `$ref` reaches dropped
  when one refers to another document (schema_bundle.py).

The node's other keywords are merged into each resulting `anyOf` branch (`merge_schemas`), so
no `allOf` and no `anyOf` beside other keywords is left for xgrammar to ignore (a merge that
is not plain data keeps an `allOf`, which sends the schema to llguidance). Only the keywords
the declared `$schema` draft defines are rewritten. A keyword without an exact rewrite is left
in place, where the gap tables refuse it by name; a node that accepts nothing becomes `false`.
A schema using none of these keywords comes back as the same object (the identity).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from radixgen.errors import GrammarError
from radixgen.json_types import JSONValue
from radixgen.runtime.constrained.schema_bundle import (
    drop_ignored_ref_siblings,
    drop_unreachable_remote_definitions,
    localize_refs,
)
from radixgen.runtime.constrained.schema_merge import (
    UNSATISFIABLE,
    canonical,
    dict_field,
    is_json_type,
    merge_schemas,
    resolve_pointer,
    schema_objects,
)

# anyOf branches one node may grow to; beyond it the request is refused naming the bound
MAX_BRANCHES = 16

REWRITTEN_KEYWORDS = frozenset(
    {"not", "dependencies", "dependentRequired", "dependentSchemas", "if"}
)
# keywords kept on the rewritten node itself (they do not constrain, or are referenced by path)
_KEPT_AT_NODE = frozenset(
    {"$schema", "$id", "id", "$comment", "$defs", "definitions", "title", "description"}
    | {"default", "examples", "deprecated", "readOnly", "writeOnly", "$anchor"}
)
_JSON_TYPES = ("null", "boolean", "object", "array", "string", "number")
_MAPS = (
    "properties",
    "patternProperties",
    "dependentSchemas",
    "dependencies",
    "$defs",
    "definitions",
)
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_VALUES = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contains",
)

Branches = list[Any]  # an anyOf: [] accepts nothing, [{}] everything


@dataclass(frozen=True)
class RewrittenSchema:
    """The schema to compile and the rewrites that produced it (empty: the input, unchanged)."""

    schema: Any
    rewrites: tuple[str, ...]


def rewrite_schema(schema: JSONValue) -> RewrittenSchema:
    """The schema with every rewritable keyword rewritten; a 400 past MAX_BRANCHES."""
    schema, bundled = localize_refs(schema)
    schema, unsiblinged = drop_ignored_ref_siblings(schema)
    schema, pruned = drop_unreachable_remote_definitions(schema)
    done = ("$ref:bundle",) * bundled + ("$ref:siblings",) * unsiblinged
    done += ("definitions:unreachable",) * pruned
    if not _uses(schema, REWRITTEN_KEYWORDS) and not _has_sibling_keywords(schema):
        return RewrittenSchema(schema, done)
    declared = str(schema.get("$schema", "")) if isinstance(schema, dict) else ""
    if ("draft-03" in declared or "draft-04" in declared) and _uses(schema, {"const"}):
        return RewrittenSchema(schema, done)  # `const` is no keyword there: merging would read it
    rewriter = _Rewriter(_ref_targets(schema), _keywords_of_draft(declared), "draft-04" in declared)
    rewriter.root = schema
    out = rewriter.node("", schema)
    if not rewriter.used:
        return RewrittenSchema(schema, done)  # nothing rewritten: the same object (or bundled)
    return RewrittenSchema(out, tuple(sorted({*rewriter.used, *done})))


def rewrite_spec(spec: str) -> tuple[str, tuple[str, ...]]:
    """The spec text to compile (the same text when nothing was rewritten) and the rewrites.

    Text that is not a JSON schema is returned as is, for the backend to report.
    """
    try:
        schema = json.loads(spec)
    except ValueError:
        return spec, ()
    done = rewrite_schema(schema)
    return (json.dumps(done.schema), done.rewrites) if done.rewrites else (spec, ())


def _uses(schema: Any, keywords: Any) -> bool:
    """Whether a keyword of `keywords` appears in the schema (instance data not looked at)."""
    if isinstance(schema, list):
        return any(_uses(s, keywords) for s in schema)
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in keywords:
            return True
        if key in ("enum", "const", "default", "examples"):
            continue
        if isinstance(value, dict) and key in ("properties", "$defs", "definitions"):
            if any(_uses(v, keywords) for v in value.values()):
                return True
        elif _uses(value, keywords):
            return True
    return False


def _has_sibling_keywords(schema: Any) -> bool:
    """Whether some node has an `anyOf`/`oneOf` beside validation keywords, or an `enum` beside
    a `type` (xgrammar reads the anyOf, oneOf or enum alone: measured, it lets `1` through
    `{"type": "integer", "minimum": 3, "anyOf": [...]}` and `"x"` through
    `{"type": "integer", "enum": [1, "x"]}`)."""
    if isinstance(schema, list):
        return any(_has_sibling_keywords(s) for s in schema)
    if not isinstance(schema, dict):
        return False
    if _sibling_key(schema) is not None or ("type" in schema and "enum" in schema):
        return True
    for key, value in schema.items():
        if key in ("enum", "const", "default", "examples"):
            continue
        if key in _MAPS and isinstance(value, dict):
            if any(_has_sibling_keywords(v) for v in value.values()):
                return True
        elif _has_sibling_keywords(value):
            return True
    return False


def _sibling_key(s: dict[str, Any]) -> str | None:
    """ "anyOf" or "oneOf" when the node has it (not both) beside validation keywords."""
    keys = [k for k in ("anyOf", "oneOf") if isinstance(s.get(k), list)]
    if len(keys) != 1 or not s.keys() - _KEPT_AT_NODE - {keys[0]}:
        return None
    return keys[0]


def _types_within(root: JSONValue, branches: JSONValue, declared: JSONValue) -> bool:
    """Whether every branch's instances provably have a type of `declared` (a `type` value)."""
    names = [declared] if isinstance(declared, str) else declared
    allowed = {t for t in names if isinstance(t, str)} if isinstance(names, list) else set()
    if not isinstance(branches, list) or not allowed:
        return False
    for branch in branches:
        types = _upper_types(root, branch, 0)
        if types is None or any(
            t not in allowed and not (t == "integer" and "number" in allowed) for t in types
        ):
            return False
    return True


def _upper_types(root: JSONValue, s: JSONValue, depth: int) -> set[str] | None:
    """A set of JSON types holding every instance of `s` (None: not known)."""
    if not isinstance(s, dict) or depth > 8:
        return set() if s is False else None
    declared = s.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return {t for t in declared if isinstance(t, str)}
    if "const" in s:
        return {_json_type(s["const"])}
    enum = s.get("enum")
    if isinstance(enum, list):
        return {_json_type(v) for v in enum}
    ref = s.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        return _upper_types(root, resolve_pointer(root, ref), depth + 1)
    for key in ("anyOf", "oneOf"):
        branches = s.get(key)
        if isinstance(branches, list):
            parts = [_upper_types(root, b, depth + 1) for b in branches]
            if all(p is not None for p in parts):
                return set().union(*(p for p in parts if p is not None))
    every = s.get("allOf")
    if isinstance(every, list):
        for b in every:
            known = _upper_types(root, b, depth + 1)
            if known is not None:
                return known
    return None


def _json_type(value: JSONValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):  # 1.0 is an integer from draft 6 on, not in draft 4
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _keywords_of_draft(declared: str) -> frozenset[str]:
    """The rewritten keywords the declared draft defines (others it ignores: left as written).

    Without `$schema`, all of them: `dependencies` is then read as draft 7 defines it, as the
    libraries' own converters do (an output meeting it is valid under 2020-12 too).
    """
    if any(f"draft-0{n}" in declared for n in (3, 4, 6)):
        return frozenset({"not", "dependencies"})
    if "draft-07" in declared:
        return frozenset({"not", "dependencies", "if"})
    if "2019-09" in declared or "2020-12" in declared:
        return REWRITTEN_KEYWORDS - {"dependencies"}
    return REWRITTEN_KEYWORDS


def _ref_targets(root: Any) -> set[str]:
    """Every local $ref's JSON pointer (without the '#')."""
    found: set[str] = set()
    for node in schema_objects(root):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            found.add(ref[1:])
    return found


class _Rewriter:
    """One schema's bottom-up rewrite; `used` collects the names reported in meta_info."""

    def __init__(self, ref_targets: set[str], keywords: frozenset[str], draft4: bool) -> None:
        self.ref_targets = ref_targets
        self.keywords = keywords  # the rewritten keywords this schema's draft defines
        self.draft4 = draft4
        self.used: set[str] = set()
        self.root: JSONValue = None  # the whole schema, where a branch's $ref is looked up

    def node(self, path: str, schema: Any) -> Any:
        """The schema at `path` (a JSON pointer) with its subschemas, then itself, rewritten."""
        if not isinstance(schema, dict):
            return schema
        out = dict(schema)
        for key, value in schema.items():
            if key in _MAPS and isinstance(value, dict):
                out[key] = {n: self.node(f"{path}/{key}/{_escape(n)}", v) for n, v in value.items()}
            elif key in _LISTS + _VALUES and isinstance(value, list):
                out[key] = [self.node(f"{path}/{key}/{i}", v) for i, v in enumerate(value)]
            elif key in _LISTS + _VALUES and isinstance(value, dict):
                out[key] = self.node(f"{path}/{key}", value)
        return self._rewrite_here(path, out)

    def _rewrite_here(self, path: str, s: dict[str, Any]) -> dict[str, Any] | bool:
        """This node with its own rewritable keywords rewritten (children are already done)."""
        if self._referenced_inside(path):
            return s
        try:
            out = self._rebuild(s) if self.keywords & s.keys() else s
        except _TooManyBranches as e:
            where = ", ".join(f"'{k}' (at {path or '/'})" for k in sorted(self.keywords & s.keys()))
            raise GrammarError(
                f"the grammar backends cannot enforce {where} in json_schema: its exact rewrite "
                f"needs {e.count} anyOf branches, over the bound of {MAX_BRANCHES}",
                "json_schema",
            ) from None
        return self._siblings(out) if isinstance(out, dict) else out

    def _siblings(self, s: dict[str, Any]) -> dict[str, Any] | bool:
        """The node with its `enum` cut to its `type`, and the keywords beside its `anyOf` or
        `oneOf` merged into each branch (allOf[S, oneOf[B..]] is oneOf[S and B..]: an instance
        failing S meets no branch, one meeting S meets as many as before). Where a merge is not
        plain data, or past MAX_BRANCHES, the node stays: the gap tables send it to llguidance."""
        enum = s.get("enum")
        if "type" in s and isinstance(enum, list):
            fit = merge_schemas({"type": s["type"]}, {"enum": enum})
            if fit is UNSATISFIABLE:
                self.used.add("enum:type")
                return False
            if isinstance(fit, dict) and fit.get("enum") != enum:
                self.used.add("enum:type")
                s = {**s, "enum": fit["enum"]}
        key = _sibling_key(s)
        if key is None:
            return s
        top = {k: v for k, v in s.items() if k in _KEPT_AT_NODE}
        rest = {k: v for k, v in s.items() if k not in _KEPT_AT_NODE and k != key}
        if any(merge_schemas(rest, b) is None for b in s[key]):
            if "type" not in rest or not _types_within(self.root, s[key], rest["type"]):
                return s
            # every branch already has one of these types: the keyword adds nothing (a $ref
            # branch takes no merge, and the backends refuse a keyword beside its anyOf)
            rest = {k: v for k, v in rest.items() if k != "type"}
            if rest and any(merge_schemas(rest, b) is None for b in s[key]):
                return s
            self.used.add("type:implied")
            if not rest:
                return {**top, key: s[key]}
        try:
            if key == "anyOf":
                branches: Branches = []
                for branch in _flatten(_conjoin([[rest], s[key]])):
                    if branch not in branches:
                        branches.append(branch)
            else:  # no branch dropped as a duplicate: two equal branches fail oneOf together
                branches = [b for b in (_one_branch(rest, b) for b in s[key]) if b is not None]
        except _TooManyBranches:
            return s
        self.used.add(f"{key}:siblings")
        if not branches:
            return False
        one = branches[0]
        if len(branches) == 1 and isinstance(one, dict) and not top.keys() & one.keys():
            return {**top, **one}
        return {**top, key: branches}

    def _rebuild(self, s: dict[str, Any]) -> dict[str, Any] | bool:
        constraints: list[Branches] = []
        dropped: list[str] = []
        names: list[str] = []
        base = {k: v for k, v in s.items() if k not in REWRITTEN_KEYWORDS | {"then", "else"}}
        if "not" in s:
            negated = self.negate(s["not"], base)
            if negated is not None:
                constraints.append(negated)
                dropped.append("not")
                names.append(f"not:{_not_form(s['not'])}")
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            branches = self._dependencies(s.get(key)) if key in self.keywords else None
            if branches is not None:
                constraints.extend(branches)
                dropped.append(key)
                names.append(key)
        if_then = "if" in self.keywords and "if" in s
        if if_then and ("then" in s or "else" in s):
            negated = self.negate(s["if"], base)
            if negated is not None:
                taken = _conjoin([[s["if"]], [s.get("then", True)]])
                constraints.append(taken + _conjoin([negated, [s.get("else", True)]]))
                dropped += ["if", "then", "else"]
                names.append("if")
        elif if_then:
            dropped.append("if")  # a lone `if` constrains nothing
        if not constraints:
            return s
        kept = {k: v for k, v in s.items() if k not in dropped}
        self.used.update(names)
        # accepting nothing is `false` (a property that must be absent, an empty array's items)
        return self._distribute(kept, constraints)

    def _referenced_inside(self, path: str) -> bool:
        """Whether a $ref points inside this node, where rebuilding it would move the target."""
        kept = tuple(f"{path}/{k}/" for k in ("$defs", "definitions"))
        return any(t.startswith(path + "/") and not t.startswith(kept) for t in self.ref_targets)

    def _distribute(self, s: dict[str, Any], constraints: list[Branches]) -> dict[str, Any] | bool:
        """`s` and every constraint, as one anyOf of merged branches (False: no instance)."""
        top = {k: v for k, v in s.items() if k in _KEPT_AT_NODE}
        base = {k: v for k, v in s.items() if k not in _KEPT_AT_NODE}
        if isinstance(base.get("anyOf"), list):
            constraints = [list(base.pop("anyOf")), *constraints]
        branches = []
        for branch in _flatten(_conjoin([[base], *constraints])):
            if branch not in branches:
                branches.append(branch)
        if not branches:
            return False
        one = branches[0]
        if len(branches) == 1 and isinstance(one, dict) and not top.keys() & one.keys():
            return {**top, **one}
        return {**top, "anyOf": branches}

    def _dependencies(self, value: Any) -> list[Branches] | None:
        """One "absent, or present with its dependency" choice per trigger property."""
        if not isinstance(value, dict):
            return None
        out: list[Branches] = []
        for name, dep in value.items():
            absent = {"properties": {name: False}}
            if isinstance(dep, list):
                out.append([absent, {"required": [name, *dep]}])
            elif dep is True or dep == {}:
                continue
            elif dep is False or isinstance(dep, dict):
                out.append([absent, *_conjoin([[{"required": [name]}], [dep]])])
            else:
                return None
        return out

    # --- not --------------------------------------------------------------------------------

    def negate(self, x: Any, ctx: dict[str, Any]) -> Branches | None:
        """anyOf branches equal to `not x` on instances valid under `ctx` (None: no exact form)."""
        if x is True:
            return []
        if x is False:
            return [{}]
        if not isinstance(x, dict):
            return None
        keys = [k for k in x if k not in _KEPT_AT_NODE]
        if not keys:
            return []
        out: Branches = []
        for key in keys:  # not (a and b) = (not a) or (not b), for keywords that do not interact
            part = self._negate_keyword(key, x[key], ctx)
            if part is None:
                return None
            out += part
        return out

    def _negate_keyword(self, key: str, value: Any, ctx: dict[str, Any]) -> Branches | None:
        if key == "type":
            return self._negate_type(value, ctx)
        if key == "required" and isinstance(value, list):
            return [{"type": "object", "properties": {name: False}} for name in value]
        if key in ("enum", "const"):
            values = [value] if key == "const" else value
            return self._negate_values(values, ctx) if isinstance(values, list) else None
        if key == "anyOf" and isinstance(value, list):
            return _conjoin_or_none([self.negate(v, ctx) for v in value])
        if key == "allOf" and isinstance(value, list):
            parts = [self.negate(v, ctx) for v in value]
            return None if any(p is None for p in parts) else [b for p in parts for b in p or []]
        if key == "not":
            return [value] if isinstance(value, (dict, bool)) else None
        if key == "properties" and isinstance(value, dict):
            return self._negate_properties(value, ctx)
        return None

    def _negate_type(self, value: Any, ctx: dict[str, Any]) -> Branches | None:
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        negated = set(names)
        left = []
        for t in _types_of(ctx):
            if t in negated or (t == "integer" and "number" in negated):
                continue
            if t == "number" and "integer" in negated:
                return None  # "a number that is not an integer" has no positive form
            left.append(t)
        return [{"type": left}] if left else []

    def _negate_values(self, values: list[Any], ctx: dict[str, Any]) -> Branches | None:
        banned = {canonical(v) for v in values}
        own = ctx.get("enum") if "const" not in ctx else [ctx["const"]]
        if isinstance(own, list):
            left = [v for v in own if canonical(v) not in banned]
            return [{"enum": left}] if left else []
        out: Branches = []
        for t in _types_of(ctx):
            hit = [v for v in values if is_json_type(v, t)]
            if not hit:
                out.append({"type": t})
            elif t == "boolean":
                left = [b for b in (False, True) if canonical(b) not in banned]
                out += [{"type": "boolean", "enum": left}] if left else []
            elif t == "null":
                continue
            elif t in ("integer", "number"):
                ranges = self._number_ranges(t, hit)
                if ranges is None:
                    return None
                out += ranges
            else:
                return None  # no positive form for "a string/object/array but these"
        return out

    def _number_ranges(self, t: str, hit: list[Any]) -> Branches | None:
        """The numbers of type `t` outside the finite set `hit`, as ranges."""
        if t == "integer":
            points = sorted({int(v) for v in hit if float(v).is_integer()})
            lows = [None, *(p + 1 for p in points)]
            highs = [*(p - 1 for p in points), None]
            out = []
            for lo, hi in zip(lows, highs, strict=True):
                if lo is not None and hi is not None and lo > hi:
                    continue
                b: dict[str, Any] = {"type": "integer"}
                b |= {"minimum": lo} if lo is not None else {}
                b |= {"maximum": hi} if hi is not None else {}
                out.append(b)
            return out
        if self.draft4 or not all(math.isfinite(v) for v in hit):
            return None  # draft 4 spells exclusive bounds as booleans, which xgrammar fails on
        points_f = sorted(set(hit))
        out = []
        for i in range(len(points_f) + 1):
            b = {"type": "number"}
            b |= {"exclusiveMinimum": points_f[i - 1]} if i > 0 else {}
            b |= {"exclusiveMaximum": points_f[i]} if i < len(points_f) else {}
            out.append(b)
        return out

    def _negate_properties(self, props: dict[str, Any], ctx: dict[str, Any]) -> Branches | None:
        """not {properties: {p: S}}: an object where some p is present and fails S."""
        own = dict_field(ctx, "properties")
        out: Branches = []
        for name, sub in props.items():
            inner = own.get(name, {})
            negated = self.negate(sub, inner if isinstance(inner, dict) else {})
            if negated is None:
                return None
            out += [
                {"type": "object", "required": [name], "properties": {name: n}} for n in negated
            ]
        return out


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _conjoin(parts: list[Branches]) -> Branches:
    """The anyOf equal to the allOf of the anyOfs `parts` (branches merged, bounded)."""
    out: Branches = [True]
    for part in parts:
        if len(out) * len(part) > MAX_BRANCHES * 4:  # checked again after merging drops some
            _too_many(len(out) * len(part))
        out = [_merge(a, b) for a in out for b in part]
        out = [b for b in out if b is not UNSATISFIABLE and b is not False]
    if len(out) > MAX_BRANCHES:
        _too_many(len(out))
    return out


def _flatten(branches: Branches) -> Branches:
    """The branches with any `anyOf` beside other keywords distributed over them (measured:
    xgrammar then serves the anyOf alone, letting `true` through a `"type": "object"`)."""
    out: Branches = []
    for branch in branches:
        inner = branch.get("anyOf") if isinstance(branch, dict) else None
        rest = {k: v for k, v in branch.items() if k != "anyOf"} if inner is not None else {}
        if not isinstance(inner, list) or not rest.keys() - _KEPT_AT_NODE:
            out.append(branch)
            continue
        out += _flatten(_conjoin([[rest], inner]))
        if len(out) > MAX_BRANCHES:
            _too_many(len(out))
    return out


def _one_branch(rest: dict[str, Any], branch: Any) -> Any:
    """A oneOf branch with the node's other keywords merged in (None: it accepts nothing)."""
    merged = merge_schemas(rest, branch)
    if merged is UNSATISFIABLE or merged is False:
        return None
    if isinstance(merged, dict) and isinstance(merged.get("anyOf"), list):
        inner = _flatten([merged])
        if not inner:
            return None
        return inner[0] if len(inner) == 1 else {"anyOf": inner}
    return merged


def _conjoin_or_none(parts: list[Branches | None]) -> Branches | None:
    if any(p is None for p in parts):
        return None
    return _conjoin([p for p in parts if p is not None])


def _merge(a: Any, b: Any) -> Any:
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    merged = merge_schemas(a, b)
    return {"allOf": [a, b]} if merged is None else merged


class _TooManyBranches(Exception):
    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


def _too_many(count: int) -> None:
    raise _TooManyBranches(count)


def _not_form(x: Any) -> str:
    """The name meta_info gives a `not` rewrite: the negated keyword(s)."""
    if isinstance(x, dict):
        keys = sorted(k for k in x if k not in _KEPT_AT_NODE)
        return "+".join(keys) or "{}"
    return json.dumps(x)


def _types_of(ctx: dict[str, Any]) -> list[str]:
    """The JSON types `ctx` admits by its `type` keyword ("integer" kept apart from "number")."""
    t = ctx.get("type")
    names = [t] if isinstance(t, str) else t if isinstance(t, list) else list(_JSON_TYPES)
    return [n for n in names if n in _JSON_TYPES or n == "integer"]
