"""Extraction jobs: the Batch API against a concurrency-16 client loop on the same server.

Issue 32's workload: `--lines` extraction requests over 8 tasks, each task a long system prompt
(instructions, the schema's description and a few-shot block, ~1,000 tokens) plus a JSON schema
(`response_format`), each line one ~300-token document, in shuffled order. The same lines go
(a) through the Batch API (`files.create` -> `batches.create` -> poll -> output file) and
(b) through a client loop that keeps 16 `/v1/chat/completions` requests in flight, with the
server's prefix cache flushed before each. Reported per mode: wall time, lines/s, output tok/s,
the prefix-cache hit rate (cached prompt tokens / prompt tokens) and how many outputs parse and
match their schema; then the interactive TTFT (a short streamed chat) on the idle server and
while a batch runs, and their ratio. vLLM's `run-batch` is not run: it does not install here.

    python benchmark/bench_batch.py [--lines 1000] [--results benchmark/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
from server_launch import launch_server
from serving_workload import random_text

TASKS = 8
IN_FLIGHT = 16
FIELDS = ("name", "city", "year", "topic", "amount", "status")


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def task_schema(t: int) -> dict[str, Any]:
    """Each task extracts a different set of fields."""
    names = [FIELDS[(t + i) % len(FIELDS)] for i in range(3)]
    props = {n: ({"type": "integer"} if n in ("year", "amount") else
                 {"type": "string", "maxLength": 24}) for n in names}  # fmt: skip
    return {"type": "object", "properties": props, "required": names,
            "additionalProperties": False}  # fmt: skip


def build_lines(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    systems = []
    for t in range(TASKS):
        schema = task_schema(t)
        answer = json.dumps({k: 1999 if v["type"] == "integer" else "example"
                             for k, v in schema["properties"].items()})  # fmt: skip
        shots = "\n\n".join(f"Document: {random_text(rng, 60)}\nAnswer: {answer}" for _ in range(8))
        systems.append(
            f"You are extraction task {t}. Read the document and return one JSON object with "
            f"the fields {', '.join(schema['required'])}, following this schema: "
            f"{json.dumps(schema)}. {random_text(rng, 150)}\n\nExamples:\n\n{shots}"
        )
    lines = []
    for i in range(n):
        t = i % TASKS
        lines.append({
            "custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "default", "temperature": 0, "max_tokens": 48,
                     "messages": [{"role": "system", "content": systems[t]},
                                  {"role": "user", "content": "Document: " + random_text(rng, 220)}],
                     "response_format": {"type": "json_schema", "json_schema": {
                         "name": f"task{t}", "schema": task_schema(t)}}},
        })  # fmt: skip
    rng.shuffle(lines)
    return lines


def summarize(mode: str, bodies: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    prompt = sum(b["usage"]["prompt_tokens"] for b in bodies)
    cached = sum(
        b["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for b in bodies
    )
    output = sum(b["usage"]["completion_tokens"] for b in bodies)
    valid = 0
    for b in bodies:
        try:
            fmt = b["_schema"]
            jsonschema.validate(json.loads(b["choices"][0]["message"]["content"]), fmt)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"mode": mode, "lines": len(bodies), "seconds": round(seconds, 1),
            "lines_per_s": round(len(bodies) / seconds, 3),
            "output_tok_per_s": round(output / seconds, 1),
            "hit_rate": round(cached / max(prompt, 1), 3), "valid": f"{valid}/{len(bodies)}"}  # fmt: skip


def run_batch_api(client: openai.OpenAI, lines: list[dict[str, Any]]) -> dict[str, Any]:
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    schema_of = {
        x["custom_id"]: x["body"]["response_format"]["json_schema"]["schema"] for x in lines
    }
    start = time.perf_counter()
    file = client.files.create(file=("bench.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    seconds = time.perf_counter() - start
    assert batch.status == "completed", batch
    bodies = []
    for raw in client.files.content(batch.output_file_id).text.splitlines():
        record = json.loads(raw)
        bodies.append({**record["response"]["body"], "_schema": schema_of[record["custom_id"]]})
    return summarize("batch_api", bodies, seconds)


async def run_client_loop(base: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    slots = asyncio.Semaphore(IN_FLIGHT)
    bodies: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base, timeout=None) as http:

        async def one(line: dict[str, Any]) -> None:
            async with slots:
                r = await http.post("/v1/chat/completions", json=line["body"])
            r.raise_for_status()
            bodies.append(
                {**r.json(), "_schema": line["body"]["response_format"]["json_schema"]["schema"]}
            )

        start = time.perf_counter()
        await asyncio.gather(*(one(x) for x in lines))
        seconds = time.perf_counter() - start
    return summarize("client_loop_16", bodies, seconds)


def ttft(client: openai.OpenAI) -> float:
    """Seconds to the first content token of a short streamed chat (a fresh prompt each time)."""
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model="default", stream=True, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": f"Say hello to user {random.random():.6f}."}],
    )  # fmt: skip
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def interactive_ttft(
    client: openai.OpenAI, lines: list[dict[str, Any]], probes: int
) -> dict[str, Any]:
    idle = [ttft(client) for _ in range(probes)]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    file = client.files.create(file=("load.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        time.sleep(0.2)
    loaded = [ttft(client) for _ in range(probes)]
    client.batches.cancel(batch.id)
    idle_p50, loaded_p50 = statistics.median(idle), statistics.median(loaded)
    return {"mode": "interactive_ttft", "idle_p50_s": round(idle_p50, 3),
            "under_batch_p50_s": round(loaded_p50, 3),
            "ratio": round(loaded_p50 / idle_p50, 2)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--probes", type=int, default=5, help="TTFT samples idle and under load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-args", default="", help="extra `radixgen serve` flags")
    ap.add_argument("--results", default=None, help="append a Markdown section to this file")
    args = ap.parse_args()
    from bench_quant import cpu_kind  # type: ignore[import-not-found]

    lines = build_lines(args.lines, args.seed)
    emit({"bench": "machine", "cpu": cpu_kind(), "lines": len(lines)})
    data_dir = Path("/tmp") / f"radixgen-bench-batch-{time.time_ns()}"
    proc, base = launch_server(["--data-dir", str(data_dir), *args.server_args.split()])
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=None)
        rows = []
        for mode in ("client_loop", "batch_api"):
            httpx.post(base + "/flush_cache", timeout=60)
            if mode == "batch_api":
                rows.append(emit(run_batch_api(client, lines)))
            else:
                rows.append(emit(asyncio.run(run_client_loop(base, lines))))
        httpx.post(base + "/flush_cache", timeout=60)
        rows.append(emit(interactive_ttft(client, lines, args.probes)))
    finally:
        proc.terminate()
        proc.wait(60)
    loop, api = rows[0], rows[1]
    ratio = round(api["lines_per_s"] / loop["lines_per_s"], 2)
    emit({"bench": "summary", "batch_api_vs_client_loop": ratio, "ttft_ratio": rows[2]["ratio"]})
    if args.results:
        section = [
            "", "## Extraction jobs: Batch API against a client loop (bench_batch.py)", "",
            f"`python {' '.join(sys.argv)}` ({time.strftime('%Y-%m-%d')}; CPU {cpu_kind()})", "",
            "| mode | lines | s | lines/s | output tok/s | prefix hit rate | valid |",
            "|---|---|---|---|---|---|---|",
            *(f"| {r['mode']} | {r['lines']} | {r['seconds']} | {r['lines_per_s']} | "
              f"{r['output_tok_per_s']} | {r['hit_rate']} | {r['valid']} |" for r in rows[:2]),
            "",
            f"Batch API / client loop throughput: {ratio}x. Interactive TTFT p50: idle "
            f"{rows[2]['idle_p50_s']} s, under the batch {rows[2]['under_batch_p50_s']} s "
            f"({rows[2]['ratio']}x).", "",
        ]  # fmt: skip
        with Path(args.results).open("a") as f:
            f.write("\n".join(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
