"""Real-world JSON-schema corpus through the offline Engine: accepted / valid / invalid / refused.

The corpus is test/data/schema_corpus (SchemaStore documents and definitions, the draft-4
JSON-Schema-Test-Suite, schemas shaped like Kubernetes/Snowplow/Washington Post ones; see
test/constrained/schema_corpus.py), sampled evenly down to --limit schemas. Each schema is
decoded greedy (max --max-new-tokens) under three setups, each its own Engine:
xgrammar only, llguidance only (--disable-grammar-backend-fallback) and the default (xgrammar,
falling back to llguidance per request). One JSON line per setup: accepted (served), valid
(finished and validates with `jsonschema`, format checks on), invalid (finished, does not
validate: must be 0), unfinished (hit the token limit), refused (a 400, counted per keyword),
and which backend served how many, and the keywords the checked layer validated
(`schema_checks`) with its rollbacks. `--choice-only` runs no model: the choice-time refusals by
keyword with the masks alone (before and after the exact rewrites, schema_rewrite.py) and with
the checked layer (runtime/constrained/schema_checks.py).

Examples:
  python benchmark/bench_schema_corpus.py
  python benchmark/bench_schema_corpus.py --jsonschemabench ../jsonschemabench --limit 200 --seed 0
  python benchmark/bench_schema_corpus.py --limit 40 --setups combined
  python benchmark/bench_schema_corpus.py --limit 1000 --choice-only
  python benchmark/bench_schema_corpus.py --limit 1000 --check-cost --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema

import radixgen

ROOT = Path(__file__).resolve().parents[1]
SETUPS: dict[str, dict[str, Any]] = {
    "xgrammar_only": {"grammar_backend": "xgrammar", "disable_grammar_backend_fallback": True},
    "llguidance_only": {"grammar_backend": "llguidance", "disable_grammar_backend_fallback": True},
    "combined": {"grammar_backend": "xgrammar"},
}


def load_corpus(limit: int, jsonschemabench: Path | None = None, seed: int = 0) -> list[Any]:
    """The corpus, evenly sampled down to `limit` schemas (deterministic); with
    `jsonschemabench`, a sample of `limit` schemas of that fetched copy drawn with `seed`."""
    path = ROOT / "test" / "constrained" / "schema_corpus.py"
    spec = importlib.util.spec_from_file_location("schema_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["schema_corpus"] = module
    spec.loader.exec_module(module)
    if jsonschemabench is not None:
        return list(module.jsonschemabench(jsonschemabench, limit, seed))
    items = module.corpus()
    if len(items) <= limit:
        return items
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def keywords_of(message: str) -> list[str]:
    """The quoted feature names a refusal's message gives (the checked layer's bound names its
    keyword; a library's own compile error is counted as such)."""
    named = re.findall(r"'([^']+)' \(at ", message)
    if named:
        return named
    bound = re.search(r"kept breaking '([^']+)'", message)
    if bound:
        return [f"{bound.group(1)} (checked layer: rollback bound)"]
    return ["(library error) " + message.removeprefix("invalid json_schema: ")[:60]]


def run_one(engine: Any, item: Any, max_new_tokens: int) -> dict[str, Any]:
    params = {"json_schema": item.spec, "max_new_tokens": max_new_tokens, "temperature": 0}
    prompt = f"Write one JSON value for the {item.name.split('/')[-1]!r} schema.\nJSON: "
    try:
        out = engine.generate(prompt, params)
    except ValueError as e:
        return {"outcome": "refused", "keywords": keywords_of(str(e)), "message": str(e)}
    meta = out["meta_info"]
    backend = meta.get("grammar_backend")
    checked = {
        "checks": meta.get("schema_checks", []),
        "rollbacks": meta.get("schema_check_rollbacks", 0),
    }
    finish = meta.get("finish_reason") or {}
    if finish.get("type") == "abort":  # the checked layer's bound: a clean error naming it
        message = finish.get("message", "")
        return {
            "outcome": "refused",
            "keywords": keywords_of(message),
            "message": message,
            **checked,
        }
    if finish.get("type") != "stop":
        return {"outcome": "unfinished", "backend": backend, "text": out["text"], **checked}
    cls = jsonschema.validators.validator_for(item.schema)
    validator = cls(item.schema, format_checker=cls.FORMAT_CHECKER)
    try:
        ok = validator.is_valid(json.loads(out["text"]))
    except json.JSONDecodeError:
        ok = False
    outcome = "valid" if ok else "invalid"
    return {"outcome": outcome, "backend": backend, "text": out["text"], **checked}


def run_setup(name: str, items: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    with (
        radixgen.Engine(log_level="error", **SETUPS[name]) as engine,
        ThreadPoolExecutor(args.concurrency) as pool,
    ):
        results = list(pool.map(lambda it: run_one(engine, it, args.max_new_tokens), items))
    outcomes = Counter(r["outcome"] for r in results)
    refused = Counter(k for r in results if r["outcome"] == "refused" for k in r["keywords"])
    invalid = [
        {"schema": it.name, "text": r["text"][:200]}
        for it, r in zip(items, results, strict=True)
        if r["outcome"] == "invalid"
    ]
    return {
        "bench": "schema_corpus",
        "setup": name,
        "schemas": len(items),
        "accepted": len(items) - outcomes["refused"],
        "valid": outcomes["valid"],
        "invalid": outcomes["invalid"],
        "unfinished": outcomes["unfinished"],
        "refused": outcomes["refused"],
        "refused_by_keyword": dict(refused.most_common()),
        "served_by": dict(Counter(r["backend"] for r in results if r.get("backend"))),
        "checked_by_keyword": dict(Counter(k for r in results for k in r.get("checks", []))),
        "check_rollbacks": sum(r.get("rollbacks", 0) for r in results),
        "invalid_examples": invalid[:5],
        "refused_examples": [
            {"schema": it.name, "message": r["message"][:300]}
            for it, r in zip(items, results, strict=True)
            if r["outcome"] == "refused"
        ][:20],
        "unfinished_examples": [
            {"schema": it.name, "text_end": r["text"][-120:]}
            for it, r in zip(items, results, strict=True)
            if r["outcome"] == "unfinished"
        ][: args.show_unfinished],
        "max_new_tokens": args.max_new_tokens,
        "seconds": round(time.perf_counter() - start, 1),
    }


def choice_only(items: list[Any]) -> dict[str, Any]:
    """Choice-time refusals by keyword, model-free: the masks alone, then with the checked layer."""
    from radixgen.errors import GrammarError
    from radixgen.runtime.constrained.schema_checks import serving_plan
    from radixgen.runtime.constrained.schema_support import backend_gaps, schema_plan

    order = ["xgrammar", "llguidance"]
    raw: Counter[str] = Counter()
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    checked: Counter[str] = Counter()
    refused = [0, 0, 0]
    for it in items:
        by_backend = backend_gaps(it.schema)  # neither the rewrites nor the checked layer
        if all(by_backend.get(name) for name in order):
            refused[2] += 1
            raw.update({g.feature for g in by_backend[order[0]] if g in by_backend[order[1]]})
        try:
            schema_plan(it.spec, order)
        except GrammarError as e:
            refused[0] += 1
            before.update(set(keywords_of(str(e))))
        try:
            plan = serving_plan(it.spec, order)[2]
            checked.update(plan.keywords if plan is not None else ())
        except GrammarError as e:
            refused[1] += 1
            after.update(set(keywords_of(str(e))))
    return {
        "bench": "schema_corpus_choice",
        "schemas": len(items),
        "refused_no_rewrites": refused[2],
        "refused_by_keyword_no_rewrites": dict(raw.most_common()),
        "refused_masks_only": refused[0],
        "refused_by_keyword_masks_only": dict(before.most_common()),
        "refused_with_checks": refused[1],
        "refused_by_keyword_with_checks": dict(after.most_common()),
        "served_with_checks_by_keyword": dict(checked.most_common()),
    }


def check_cost(items: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The checked layer's cost per output token: each schema it serves, decoded greedy with its
    checks and as the relaxed schema the grammar compiles (the same mask, no checked keyword),
    one request at a time, the two sides alternating, best of `--repeats` per side."""
    from radixgen.runtime.constrained.schema_checks import serving_plan

    pairs = []
    for it in items:
        try:
            plan = serving_plan(it.spec, ["xgrammar", "llguidance"])[2]
        except Exception:  # refused (or a library error): no pair to time
            continue
        if plan is not None:
            pairs.append((it, json.dumps(plan.schema)))
    rows = []
    with radixgen.Engine(log_level="error", **SETUPS["combined"]) as engine:

        def timed(spec: str, prompt: str) -> tuple[float, int, int]:
            params = {"json_schema": spec, "max_new_tokens": args.max_new_tokens, "temperature": 0}
            start = time.perf_counter()
            out = engine.generate(prompt, params)
            seconds = time.perf_counter() - start
            meta = out["meta_info"]
            return seconds, meta["completion_tokens"], meta.get("schema_check_rollbacks", 0)

        for it, relaxed in pairs:
            prompt = f"Write one JSON value for the {it.name.split('/')[-1]!r} schema.\nJSON: "
            try:
                timed(it.spec, prompt), timed(relaxed, prompt)  # compiles, warm caches
            except ValueError:
                continue
            best: dict[str, tuple[float, int, int]] = {}
            for r in range(args.repeats):
                sides = [("checked", it.spec), ("relaxed", relaxed)]
                for side, spec in sides if r % 2 == 0 else sides[::-1]:
                    engine.flush_cache()  # both sides prefill the prompt
                    got = timed(spec, prompt)
                    per = got[0] / max(got[1], 1)
                    if side not in best or per < best[side][0] / max(best[side][1], 1):
                        best[side] = got
            (ct, cn, rb), (rt, rn, _) = best["checked"], best["relaxed"]
            rows.append(
                {
                    "schema": it.name,
                    "tokens": [cn, rn],
                    "rollbacks": rb,
                    "ms_per_token": [
                        round(1e3 * ct / max(cn, 1), 2),
                        round(1e3 * rt / max(rn, 1), 2),
                    ],
                    "ratio": round((ct / max(cn, 1)) / (rt / max(rn, 1)), 3),
                }
            )
    ratios = sorted(r["ratio"] for r in rows)
    plain = sorted(r["ratio"] for r in rows if r["rollbacks"] == 0)
    return {
        "bench": "schema_check_cost",
        "schemas": len(rows),
        "median_ratio": ratios[len(ratios) // 2] if ratios else None,
        "median_ratio_without_rollbacks": plain[len(plain) // 2] if plain else None,
        "total_ratio": round(
            sum(r["ms_per_token"][0] * r["tokens"][0] for r in rows)
            / max(sum(r["tokens"][0] for r in rows), 1)
            / (
                sum(r["ms_per_token"][1] * r["tokens"][1] for r in rows)
                / max(sum(r["tokens"][1] for r in rows), 1)
            ),
            3,
        )
        if rows
        else None,
        "rows": rows,
        "max_new_tokens": args.max_new_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=80, help="Schemas, sampled evenly.")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--show-unfinished", type=int, default=0, help="Print N output tails.")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--choice-only", action="store_true", help="No model: refusals only.")
    parser.add_argument(
        "--jsonschemabench",
        type=Path,
        default=None,
        help="A fetched copy of JSONSchemaBench (its repository, or a folder of its MaskBench "
        "files): a seeded sample of --limit schemas of it instead of the corpus.",
    )
    parser.add_argument("--seed", type=int, default=0, help="The --jsonschemabench sample's seed.")
    parser.add_argument(
        "--check-cost",
        action="store_true",
        help="The checked layer's cost per token on the schemas it serves (against their "
        "relaxed schema without the checked keywords), instead of the setups.",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--check-cost: runs per side.")
    args = parser.parse_args()
    items = load_corpus(args.limit, args.jsonschemabench, args.seed)
    if args.check_cost:
        print(json.dumps(check_cost(items, args)), flush=True)
        return
    if args.choice_only:
        print(json.dumps(choice_only(items)), flush=True)
        return
    for name in args.setups:
        print(json.dumps(run_setup(name, items, args)), flush=True)


if __name__ == "__main__":
    main()
