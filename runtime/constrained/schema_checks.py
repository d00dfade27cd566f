"""The checked layer's compile side: what no exact rewrite expresses is relaxed, then checked.

Runs in the scheduler process (backend choice, `meta_info`) and in the compile workers (the
backends compile the relaxed schema). After the exact rewrites (schema_rewrite.py), the
keywords no backend enforces and no rewrite removed (`uniqueItems`, overlapping `oneOf`,
`multipleOf`, which xgrammar ignores, `not`/`if`/`dependencies` of other forms, `contains`) are
dropped from the schema the grammar compiles (an overlapping `oneOf` becomes `anyOf`), so the
mask only ever lets through a superset of the valid outputs. Each dropped keyword is covered by
a `ValueCheck`: the nearest enclosing subschema reached from the root along instance paths
(`properties`, `items`, `prefixItems`, local `$ref`s), which the scheduler validates when that
value completes and rolls back when it fails (value_checker.py). Relaxing only loosens, and
every reachable dropped keyword lies under some check, so the served outputs stay exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from radixgen.errors import GrammarError
from radixgen.json_types import JSONValue
from radixgen.runtime.constrained.schema_merge import resolve_pointer
from radixgen.runtime.constrained.schema_rewrite import rewrite_schema
from radixgen.runtime.constrained.schema_support import (
    _one_of_disjoint,
    _validation_keys,
    backend_gaps,
    schema_plan,
)

# keywords the checked layer drops from the compiled schema and validates at run time
CHECKED_KEYWORDS = frozenset(
    {"uniqueItems", "multipleOf", "oneOf", "not", "if", "contains"}
    | {"dependencies", "dependentRequired", "dependentSchemas"}
)
# dropped beside their keyword (they mean nothing without it)
_COMPANIONS = {"if": ("then", "else"), "contains": ("minContains", "maxContains")}
_DATA = ("enum", "const", "default", "examples")
# children at the same instance location as their parent (a check there covers the parent)
_IN_PLACE_LISTS = ("anyOf", "oneOf", "allOf")
_IN_PLACE_VALUES = ("not", "if", "then", "else", "contains", "additionalProperties")
_IN_PLACE_VALUES_MORE = ("unevaluatedProperties", "unevaluatedItems", "propertyNames")
_IN_PLACE_MAPS = ("patternProperties", "dependentSchemas", "dependencies")
_MAPS = ("patternProperties",)  # maps of schemas the relaxation keeps


@dataclass(frozen=True)
class ItemsFrom:
    """A path step matching every array index from `start` on (`items` after `prefixItems`)."""

    start: int


PathStep = str | int | ItemsFrom


@dataclass(frozen=True)
class ValueCheck:
    """A value to validate when it completes: where (instance path pattern) and against what."""

    path: tuple[PathStep, ...]
    schema: Any  # the subschema of the rewritten (unrelaxed) schema
    keywords: tuple[str, ...]  # the checked keywords under it (messages)
    unique_items: bool  # an array with uniqueItems: each item is checked against the earlier

    def matches(self, path: tuple[str | int, ...]) -> bool:
        if len(path) != len(self.path):
            return False
        for want, got in zip(self.path, path, strict=True):
            if isinstance(want, ItemsFrom):
                if not isinstance(got, int) or got < want.start:
                    return False
            elif want != got or type(want) is not type(got):
                return False
        return True


@dataclass(frozen=True)
class CheckPlan:
    """The relaxed schema the grammar compiles, the checks that make it exact, and the root
    the checks' `$ref`s resolve against."""

    schema: Any
    checks: tuple[ValueCheck, ...]
    keywords: tuple[str, ...]  # every checked keyword, sorted (meta_info.schema_checks)
    root: Any


def checked_here(root: Any, s: dict[str, Any]) -> list[str]:
    """The checked keywords this subschema itself uses (each as the relaxation drops it)."""
    out: list[str] = [
        k for k in ("multipleOf", "not", "dependencies", "dependentRequired") if k in s
    ]
    out += [k for k in ("dependentSchemas", "contains") if k in s]
    max_items = s.get("maxItems")
    if s.get("uniqueItems") is True and not (isinstance(max_items, int) and max_items <= 1):
        out.append("uniqueItems")
    if "if" in s and ("then" in s or "else" in s):
        out.append("if")
    if isinstance(s.get("oneOf"), list) and not _one_of_disjoint(root, s["oneOf"]):
        out.append("oneOf")
    return out


def _walk(root: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every subschema reachable from `root` (local $refs followed), each once, without
    recursion: a schema hundreds of levels deep must not overflow the stack."""
    stack: list[Any] = [root]
    seen: set[int] = set()
    while stack:
        s = stack.pop()
        if not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        yield s
        stack.extend(_children(s))
        ref = s.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            stack.append(resolve_pointer(root, ref))


def _any_checked(root: dict[str, Any]) -> bool:
    return any(checked_here(root, s) for s in _walk(root))


def _checked_keywords(root: dict[str, Any]) -> set[str]:
    return {k for s in _walk(root) for k in checked_here(root, s)}


def plan_checks(schema: JSONValue) -> CheckPlan | None:
    """The checked layer's plan for a (rewritten) schema; None when it needs no check."""
    if not isinstance(schema, dict):
        return None
    if not _any_checked(schema):  # iterative: a plain schema of any depth costs one walk
        return None
    finder = _Finder(schema)
    try:
        finder.collect(schema, (), frozenset())
        if not finder.checks:
            return None
        relaxed = _relax(schema, schema)
    except RecursionError:
        raise GrammarError(
            "json_schema is nested too deeply for its checked keywords "
            f"({', '.join(sorted(_checked_keywords(schema)))})", "json_schema"
        ) from None  # fmt: skip
    keywords = tuple(sorted({k for c in finder.checks for k in c.keywords}))
    return CheckPlan(relaxed, tuple(finder.checks), keywords, schema)


def relax_for_checks(schema: JSONValue) -> JSONValue:
    """The schema a backend compiles: relaxed where the checked layer validates instead."""
    plan = plan_checks(schema)
    return schema if plan is None else plan.schema


def serving_plan(
    spec: str, order: list[str]
) -> tuple[list[str], tuple[str, ...], CheckPlan | None]:
    """`schema_plan` with the checked layer: the backends that serve the relaxed schema exactly,
    the exact rewrites, and the checks (None: the schema is served by the masks alone)."""
    try:
        raw = json.loads(spec)
    except ValueError:
        return order[:1], (), None
    rewritten = rewrite_schema(raw)
    plan = plan_checks(rewritten.schema)
    if plan is None:
        return (*schema_plan(spec, order), None)
    by_backend = backend_gaps(plan.schema)
    exact = [name for name in order if name in by_backend and not by_backend[name]]
    if not exact:  # what is left is a gap of the relaxed schema: the usual refusal names it
        relaxed = json.dumps(plan.schema)
        schema_plan(relaxed, order)
        raise GrammarError("json_schema cannot be served", "json_schema")  # (not reached)
    return exact, rewritten.rewrites, plan


class _Finder:
    """Walks the schema from the root along instance paths, placing a check at each subschema
    whose keywords or in-place children use a checked keyword."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.checks: list[ValueCheck] = []
        self._needs: dict[int, bool] = {}

    def needs(self, s: Any) -> bool:
        """Whether a checked keyword is reachable from `s` (following local $refs)."""
        if not isinstance(s, dict):
            return False
        known = self._needs.get(id(s))
        if known is not None:
            return known
        self._needs[id(s)] = False  # a $ref cycle without checked keywords needs none
        found = bool(checked_here(self.root, s)) or any(self.needs(c) for c in _children(s))
        ref = s.get("$ref")
        if not found and isinstance(ref, str) and ref.startswith("#"):
            found = self.needs(resolve_pointer(self.root, ref))
        self._needs[id(s)] = found
        return found

    def keywords(self, s: Any, seen: set[int] | None = None) -> set[str]:
        """The checked keywords reachable from `s`."""
        seen = set() if seen is None else seen
        if not isinstance(s, dict) or id(s) in seen:
            return set()
        seen.add(id(s))
        out = set(checked_here(self.root, s))
        for c in _children(s):
            out |= self.keywords(c, seen)
        ref = s.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out |= self.keywords(resolve_pointer(self.root, ref), seen)
        return out

    def collect(self, s: Any, path: tuple[PathStep, ...], refs: frozenset[str]) -> None:
        if not self.needs(s):
            return
        assert isinstance(s, dict)
        ref = s.get("$ref")
        if isinstance(ref, str):
            if _validation_keys(s) - {"$ref"} or not ref.startswith("#") or ref in refs:
                self._add(s, path)
            else:
                self.collect(resolve_pointer(self.root, ref), path, refs | {ref})
            return
        if checked_here(self.root, s) or any(self.needs(c) for c in _in_place(s)):
            self._add(s, path)
            return
        props = s.get("properties")
        for name, sub in props.items() if isinstance(props, dict) else ():
            self.collect(sub, (*path, name), refs)
        prefix = s.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = s.get("items")
        if isinstance(items, list):  # draft 4-7 tuple form; additionalItems after it
            prefix, items = items, s.get("additionalItems")
        for i, sub in enumerate(prefix):
            self.collect(sub, (*path, i), refs)
        if isinstance(items, dict):
            self.collect(items, (*path, ItemsFrom(len(prefix))), refs)

    def _add(self, s: dict[str, Any], path: tuple[PathStep, ...]) -> None:
        keywords = tuple(sorted(self.keywords(s)))
        unique = "uniqueItems" in checked_here(self.root, s)
        self.checks.append(ValueCheck(path, s, keywords, unique))


def _children(s: dict[str, Any]) -> list[Any]:
    """Every direct subschema of `s` (instance data not looked at)."""
    out: list[Any] = []
    for key, value in s.items():
        if key in _DATA or key in ("$defs", "definitions"):
            continue
        if isinstance(value, dict) and key in ("properties", *_IN_PLACE_MAPS):
            out += [v for v in value.values() if isinstance(v, dict)]
        elif isinstance(value, dict):
            out.append(value)
        elif isinstance(value, list) and key in (*_IN_PLACE_LISTS, "prefixItems", "items"):
            out += [v for v in value if isinstance(v, dict)]
    return out


def _in_place(s: dict[str, Any]) -> list[Any]:
    """The subschemas of `s` that apply to the same value (or to keys the walk does not follow)."""
    out: list[Any] = []
    for key in _IN_PLACE_LISTS:
        if isinstance(s.get(key), list):
            out += s[key]
    out += [s[k] for k in (*_IN_PLACE_VALUES, *_IN_PLACE_VALUES_MORE) if k in s]
    for key in _IN_PLACE_MAPS:
        if isinstance(s.get(key), dict):
            out += list(s[key].values())
    return out


def _relax(root: Any, s: Any) -> Any:
    """A copy without the checked keywords (an overlapping oneOf as anyOf)."""
    if isinstance(s, list):
        return [_relax(root, v) for v in s]
    if not isinstance(s, dict):
        return s
    here = set(checked_here(root, s))
    drop = here - {"oneOf"}
    drop |= {c for k in here for c in _COMPANIONS.get(k, ())}
    if "uniqueItems" in s:
        drop.add("uniqueItems")  # false, or at most one item: nothing to check
    out: dict[str, Any] = {}
    for key, value in s.items():
        if key in drop:
            continue
        if key in _DATA:
            out[key] = value
        elif key == "oneOf" and "oneOf" in here and "anyOf" not in s:
            out["anyOf"] = _relax(root, value)
        elif isinstance(value, dict) and key in ("properties", "$defs", "definitions", *_MAPS):
            out[key] = {k: _relax(root, v) for k, v in value.items()}
        else:
            out[key] = _relax(root, value)
    return out
