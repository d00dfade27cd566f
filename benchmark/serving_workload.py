"""Workloads and statistics of `bench_serving.py`: random / shared-prefix prompts, percentiles."""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

# Common English words: each is about one token for BPE vocabularies, so N words ~ N tokens.
WORDS = (  # noqa: SIM905
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education"
).split()


@dataclass
class Sample:
    prompt: str
    output_len: int


@dataclass
class Result:
    ok: bool = False
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


def random_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def build_dataset(args: argparse.Namespace, n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    if args.dataset == "random":
        return [Sample(random_text(rng, args.input_len), args.output_len) for _ in range(n)]
    prefixes = [random_text(rng, args.prefix_len) for _ in range(args.num_groups)]
    return [
        Sample(
            prefixes[i % args.num_groups] + "\n" + random_text(rng, args.input_len), args.output_len
        )
        for i in range(n)
    ]


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k] * 1000


def summarize(results: list[Result], duration: float, extra: dict[str, Any]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    itls = [x for r in ok for x in r.itls]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    line = {
        **extra,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": round(duration, 3),
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "cached_tokens": sum(r.cached_tokens for r in ok),
        "request_throughput": round(len(ok) / duration, 3),
        "output_throughput": round(out_tokens / duration, 2),
        "total_token_throughput": round((in_tokens + out_tokens) / duration, 2),
    }
    for name, vals in (("ttft", [r.ttft for r in ok]), ("itl", itls), ("e2e", [r.e2e for r in ok])):
        line[f"{name}_ms_mean"] = round(statistics.fmean(vals) * 1000, 2) if vals else 0.0
        line[f"{name}_ms_p50"] = round(pct(vals, 50), 2)
        line[f"{name}_ms_p99"] = round(pct(vals, 99), 2)
    errors = [r.error for r in results if not r.ok]
    if errors:
        line["first_error"] = errors[0]
    return line


async def sse_events(resp: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an OpenAI-style server-sent event stream (an aiohttp response), up
    to `[DONE]`."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        yield json.loads(payload)


def content_piece(choice: dict[str, Any]) -> str | None:
    """The text a streamed completions or chat-completions choice adds."""
    if "text" in choice:
        return choice.get("text")
    return (choice.get("delta") or {}).get("content")
