"""`$ref`s to another document of the same bundle, rewritten as pointers from the root.

A schema document may embed other schema resources, each named by its `$id` (`id` in drafts 3
and 4), and refer to them, or to a plain-name anchor (`$anchor`, or an `$id` of the form
`#name` before 2019-09), by URI: `"$ref": "address.json"` resolved against the base URI of the
schema around it. No grammar backend resolves those (xgrammar takes local `#/` pointers only,
llguidance refuses a reference to another document), so they used to be refused.

Every such reference names a subschema of the same document, so it is rewritten as the JSON
pointer of that subschema from the root, which every backend follows. A `#/...` pointer inside an
embedded resource is relative to that resource, so it is rewritten too; a reference to a document
outside the bundle is made absolute. The embedded resources' identifiers are then dropped (all
references are resolved already), so no backend re-bases the pointers. The valid instances are the
same: each reference names the same subschema as before. A schema using `$dynamicRef` or
`$recursiveRef` (their target depends on the evaluation path) is left as it is.
"""

from __future__ import annotations

import copy
from urllib.parse import unquote, urldefrag, urljoin

from radixgen.json_types import JSONObject, JSONValue
from radixgen.runtime.constrained.schema_merge import schema_objects

# keywords whose value is a map of name -> subschema, a list of subschemas, or a subschema
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_DYNAMIC = frozenset({"$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor"})
# characters a pointer may hold in a `$ref` without percent-encoding
_PLAIN = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/!$&'()*+,;=:@"
)


def _escape(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


SchemaPath = tuple[str | int, ...]


def _subschemas(node: JSONObject) -> list[tuple[SchemaPath, JSONValue]]:
    """(relative path, value) of each subschema position of `node`."""
    out: list[tuple[SchemaPath, JSONValue]] = []
    for key, value in node.items():
        if key in _MAPS and isinstance(value, dict):
            out += [((key, name), sub) for name, sub in value.items()]
        elif key == "dependencies" and isinstance(value, dict):  # a list form is no schema
            out += [((key, name), sub) for name, sub in value.items() if isinstance(sub, dict)]
        elif (key in _LISTS or key == "items") and isinstance(value, list):
            out += [((key, i), sub) for i, sub in enumerate(value)]
        elif key in _ONE:
            out.append(((key,), value))
    return out


class _Bundle:
    def __init__(self, root: JSONObject) -> None:
        declared = str(root.get("$schema", ""))
        self.id_key = "id" if "draft-03" in declared or "draft-04" in declared else "$id"
        self.plain_name_ids = "draft/20" not in declared  # `#name` ids before 2019-09
        self.resources: dict[str, SchemaPath] = {}
        self.anchors: dict[tuple[str, str], SchemaPath] = {}
        self.refs: list[tuple[SchemaPath, str, str]] = []  # path, base, $ref
        self.nested_ids: list[SchemaPath] = []
        self.dynamic = False
        self._walk(root, (), "")

    def _walk(self, node: JSONValue, path: SchemaPath, base: str) -> None:
        if not isinstance(node, dict):
            return
        if _DYNAMIC & node.keys():
            self.dynamic = True
        ident = node.get(self.id_key)
        if self.plain_name_ids and "$ref" in node:
            ident = None  # before 2019-09 every keyword beside a $ref is ignored, its id too
        if isinstance(ident, str):
            if path:
                self.nested_ids.append(path)
            if ident.startswith("#") and self.plain_name_ids:
                self.anchors[(urldefrag(base).url, ident[1:])] = path
            else:
                base = urljoin(base, ident)
                self.resources[urldefrag(base).url] = path
        elif not path:
            self.resources[""] = path
        anchor = node.get("$anchor")
        if isinstance(anchor, str):
            self.anchors[(urldefrag(base).url, anchor)] = path
            if path:
                self.nested_ids.append(path)
        ref = node.get("$ref")
        if isinstance(ref, str):
            self.refs.append((path, base, ref))
        for rel, sub in _subschemas(node):
            self._walk(sub, path + rel, base)

    def target(self, base: str, ref: str) -> str | None:
        """The root-relative pointer `ref` names, or None when it is outside the bundle."""
        url, fragment = urldefrag(urljoin(base, ref))
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            path = self.anchors.get((url, fragment))
            return None if path is None else "#" + "".join("/" + _escape(p) for p in path)
        if url not in self.resources:
            return None
        return "#" + "".join("/" + _escape(p) for p in self.resources[url]) + fragment


def localize_refs(schema: JSONValue) -> tuple[JSONValue, bool]:
    """The schema with its references inside the bundle as root pointers, and whether any
    changed (unchanged: the same object)."""
    if not isinstance(schema, dict):
        return schema, False
    bundle = _Bundle(schema)
    if bundle.dynamic:
        return schema, False
    new_refs: dict[SchemaPath, str] = {}
    for path, base, ref in bundle.refs:
        target = bundle.target(base, ref)
        if target is None:  # another document: absolute, as the ids around it made it
            target = urljoin(base, ref) if bundle.nested_ids else ref
        if target != ref:
            if not set(target[1:] if target.startswith("#") else "") <= _PLAIN:
                return schema, False  # a pointer needing escapes: left for the gap tables
            new_refs[path] = target
    if not new_refs:
        return schema, False
    out = copy.deepcopy(schema)
    for path, target in new_refs.items():
        _at(out, path)["$ref"] = target
    for path in bundle.nested_ids:
        node = _at(out, path)
        node.pop(bundle.id_key, None)
        node.pop("$anchor", None)
    return out, True


def _at(root: JSONValue, path: SchemaPath) -> JSONObject:
    node = root
    for part in path:
        if isinstance(node, dict) and isinstance(part, str):  # noqa: SIM114 (narrowing)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int):
            node = node[part]
        else:
            raise KeyError(part)
        if not isinstance(node, (dict, list)):
            raise KeyError(part)
    assert isinstance(node, dict)
    return node


# beside a $ref before 2019-09 these stay: containers pointers may reach, and annotations
_KEPT_BESIDE_REF = frozenset(
    {"$ref", "definitions", "$defs", "$schema", "title", "description", "$comment"}
    | {"default", "examples"}
)


def drop_ignored_ref_siblings(schema: JSONValue) -> tuple[JSONValue, bool]:
    """Before 2019-09 a `$ref` overrides the keywords beside it (`{"$ref": ..., "type":
    "object"}` validates as the `$ref` alone); the schema without those keywords, which the
    backends would otherwise enforce or refuse, and whether any was dropped. A keyword a local
    pointer reaches into is kept. Only for a schema declaring draft 3, 4, 6 or 7."""
    if not isinstance(schema, dict):
        return schema, False
    declared = str(schema.get("$schema", ""))
    if not any(f"draft-0{n}" in declared for n in (3, 4, 6, 7)):
        return schema, False
    bundle = _Bundle(schema)
    if bundle.dynamic:
        return schema, False
    pointers = [ref for _, _, ref in bundle.refs if ref.startswith("#/")]
    drops: list[tuple[SchemaPath, list[str]]] = []
    for path, _, _ in bundle.refs:
        node = _at(schema, path)
        here = "#" + "".join("/" + _escape(p) for p in path)
        keys = [
            k
            for k in node
            if k not in _KEPT_BESIDE_REF
            and not any(
                p == f"{here}/{_escape(k)}" or p.startswith(f"{here}/{_escape(k)}/")
                for p in pointers
            )
        ]
        if keys:
            drops.append((path, keys))
    if not drops:
        return schema, False
    out = copy.deepcopy(schema)
    for path, keys in drops:  # outer first: a $ref inside a dropped keyword is gone with it
        try:
            node = _at(out, path)
        except KeyError:
            continue
        for k in keys:
            del node[k]
    return out, True


def drop_unreachable_remote_definitions(schema: JSONValue) -> tuple[JSONValue, bool]:
    """The schema without the root `definitions` / `$defs` entries no local `$ref` reaches,
    when one of them refers to another document, and whether any was dropped.

    A definition nothing refers to validates nothing, but the backends resolve every `$ref` of
    the document when they compile it, and a reference to a document they cannot fetch fails
    the whole schema (a SchemaStore definition served on its own carries all its siblings). Run
    after `localize_refs`, so a reference inside the bundle is a local pointer by then."""
    if not isinstance(schema, dict):
        return schema, False
    maps = [k for k in ("definitions", "$defs") if isinstance(schema.get(k), dict)]
    if not maps or _Bundle(schema).dynamic:
        return schema, False
    entries = {(k, name): sub for k in maps for name, sub in _entries(schema[k])}
    reached: set[tuple[str, str]] = set()
    todo: list[JSONValue] = [{k: v for k, v in schema.items() if k not in maps}]
    while todo:
        for node in schema_objects(todo.pop()):
            ref = node.get("$ref")
            if not isinstance(ref, str) or not ref.startswith("#/"):
                continue
            parts = ref[2:].split("/")
            if len(parts) == 1 and parts[0] in maps:
                return schema, False  # the whole map is named: every entry may be reached
            if len(parts) >= 2:
                key = (parts[0], parts[1].replace("~1", "/").replace("~0", "~"))
                if key in entries and key not in reached:
                    reached.add(key)
                    todo.append(entries[key])
    unreached = [key for key in entries if key not in reached]
    if not any(_remote_ref(entries[key]) for key in unreached):
        return schema, False
    out = dict(schema)
    for k in maps:
        out[k] = {n: v for n, v in _entries(schema[k]) if (k, n) in reached}
    return out, True


def _entries(value: JSONValue) -> list[tuple[str, JSONValue]]:
    return list(value.items()) if isinstance(value, dict) else []


def _remote_ref(root: JSONValue) -> bool:
    return any(
        isinstance(node.get("$ref"), str) and not str(node.get("$ref")).startswith("#")
        for node in schema_objects(root)
    )
