"""The real-world JSON-schema corpus (test/data/schema_corpus, see its README): schemas, instances.

Three sources, each item a `CorpusSchema`:
- draft4_suite: the official JSON-Schema-Test-Suite (draft 4), valid and invalid instances per
  keyword, as written by the suite's authors;
- schemastore: SchemaStore documents (GitHub workflows, Dependabot, ...): each document and each
  of its definitions as a schema of its own (like JSONSchemaBench's GitHub/SchemaStore sets);
  no instances, so only generated outputs are checked;
- made here: schemas shaped like Kubernetes, Snowplow, Washington Post and GitHub API ones, with
  instances, covering the traps measured on the backends (pattern with length bounds, `required`
  names missing from `properties`, oneOf, unknown formats).
Imported by the grammar tests and by benchmark/bench_schema_corpus.py (by path).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "schema_corpus"


@dataclass
class CorpusSchema:
    name: str
    schema: Any
    valid: list[Any] = field(default_factory=list)
    invalid: list[Any] = field(default_factory=list)

    @property
    def spec(self) -> str:
        return json.dumps(self.schema)


def suite_schemas() -> list[CorpusSchema]:
    out = []
    for path in sorted((DATA / "draft4_suite").glob("*.json")):
        for i, group in enumerate(json.loads(path.read_text())):
            schema = {"$schema": "http://json-schema.org/draft-04/schema#", **group["schema"]}
            item = CorpusSchema(f"suite/{path.stem}/{i}", schema)
            for test in group["tests"]:
                (item.valid if test["valid"] else item.invalid).append(test["data"])
            out.append(item)
    return out


def schemastore_schemas() -> list[CorpusSchema]:
    out = []
    for path in sorted((DATA / "schemastore").glob("*.json")):
        root = json.loads(path.read_text())
        out.append(CorpusSchema(f"schemastore/{path.stem}", root))
        for key in ("definitions", "$defs"):
            defs = root.get(key)
            if not isinstance(defs, dict):
                continue
            shared = {k: root[k] for k in ("$schema", "definitions", "$defs") if k in root}
            for name in defs:
                pointer = name.replace("~", "~0").replace("/", "~1")
                schema = {**shared, "$ref": f"#/{key}/{pointer}"}
                out.append(CorpusSchema(f"schemastore/{path.stem}/{name}", schema))
    return out


_K8S_LABELS = {
    "type": "object",
    "additionalProperties": {"type": "string", "maxLength": 63},
}
MADE_HERE: list[CorpusSchema] = [
    CorpusSchema(
        "made/k8s-container",
        {
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                    "maxLength": 63,
                },
                "image": {"type": "string"},
                "ports": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                            "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                        },
                        "required": ["containerPort"],
                    },
                },
                "labels": _K8S_LABELS,
            },
            "required": ["name", "image"],
        },
        valid=[{"name": "web", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}],
        invalid=[{"name": "a" * 64, "image": "x"}, {"name": "Web", "image": "x"}],
    ),
    CorpusSchema(
        "made/snowplow-event",
        {
            "type": "object",
            "properties": {
                "schema": {"type": "string", "pattern": "^iglu:", "maxLength": 128},
                "event_id": {"type": "string", "format": "uuid"},
                "data": {"type": "object", "properties": {"category": {"type": "string"}}},
            },
            "required": ["schema", "event_id", "collector_tstamp"],
        },
        valid=[
            {
                "schema": "iglu:com.acme/click/jsonschema/1-0-0",
                "event_id": "123e4567-e89b-12d3-a456-426614174000",
                "data": {},
                "collector_tstamp": "2024-01-01",
            }
        ],
        invalid=[{"schema": "iglu:x", "event_id": "123e4567-e89b-12d3-a456-426614174000"}],
    ),
    CorpusSchema(
        "made/washington-post-article",
        {
            "type": "object",
            "properties": {
                "_id": {"type": "string", "minLength": 1},
                "type": {"const": "story"},
                "headlines": {
                    "type": "object",
                    "properties": {"basic": {"type": "string"}},
                    "required": ["basic"],
                },
                "canonical_url": {"type": "string", "format": "uri-reference"},
                "taxonomy": {
                    "type": "object",
                    "properties": {
                        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}
                    },
                },
                "promo_items": {
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "properties": {"url": {"type": "string"}},
                            "required": ["url"],
                        },
                    ]
                },
            },
            "required": ["_id", "type", "headlines"],
        },
        valid=[{"_id": "A1", "type": "story", "headlines": {"basic": "Hi"}, "promo_items": None}],
        invalid=[{"_id": "", "type": "story", "headlines": {"basic": "Hi"}}],
    ),
    CorpusSchema(
        "made/github-issue",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 256},
                "body": {"type": ["string", "null"]},
                "labels": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "state": {"enum": ["open", "closed"]},
                "created_at": {"type": "string", "format": "date-time"},
            },
            "required": ["title", "state"],
        },
        valid=[{"title": "Crash on start", "body": None, "state": "open"}],
        invalid=[{"title": "", "state": "open"}, {"title": "x", "state": "merged"}],
    ),
    CorpusSchema(
        "made/api-response-allof",
        {
            "allOf": [
                {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                {"properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
            ]
        },
        valid=[{"id": 1, "ok": True}],
        invalid=[{"id": 1}, {"ok": True}],
    ),
    CorpusSchema(
        "made/tags-unique",
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
            },
            "required": ["tags"],
        },
        valid=[{"tags": ["a", "b"]}],
        invalid=[{"tags": ["a", "a"]}],
    ),
]


def jsonschemabench(folder: Path, sample: int, seed: int) -> list[CorpusSchema]:
    """A seeded sample of JSONSchemaBench from a fetched copy (never committed): `folder` holds
    its MaskBench files (`maskbench/data/<Set>---<name>.json`: the schema with its valid and
    invalid instances) or the plain per-set schemas (`data/<Set>/<name>.json`)."""
    if (folder / "maskbench" / "data").is_dir():
        folder = folder / "maskbench" / "data"
    paths = sorted(folder.rglob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no JSONSchemaBench schema under {folder}")
    chosen = sorted(random.Random(seed).sample(paths, min(sample, len(paths))))
    out = []
    for path in chosen:
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "schema" in doc and "tests" in doc:
            name = path.stem.replace("---", "/")
            item = CorpusSchema(f"jsb/{name}", doc["schema"])
            for test in doc["tests"]:
                (item.valid if test["valid"] else item.invalid).append(test["data"])
        else:
            item = CorpusSchema(f"jsb/{path.parent.name}/{path.stem}", doc)
        out.append(item)
    return out


def corpus() -> list[CorpusSchema]:
    """Every corpus schema: made-here first, then the test suite, then SchemaStore."""
    return [*MADE_HERE, *suite_schemas(), *schemastore_schemas()]
