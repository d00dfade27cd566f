"""RadixGen against its CPU peers over the same OpenAI-compatible HTTP client, in one run.

Issue 29's serving table: each server is started in turn and given the same four workloads,
alternating servers per repetition so that all of them see the machine's load drift:

- single stream: one chat request, 128 tokens: decode tok/s (tokens after the first / time);
- 32 concurrent x 128 tokens (completions over random-word prompts): output tok/s;
- 64 requests sharing one ~1,500-token prefix, 16 in flight, 16 tokens each: req/s;
- 16 JSON-schema chat requests at once (`response_format`), 64 tokens max: output tok/s, and
  how many replies parse and match the schema.

Servers: `radixgen` (what `radixgen serve` picks on this CPU: the GGUF kept quantized on the
best kernel variant), `radixgen_f32_torch` (the path every CPU without AVX512-BF16 ran before
the kernel variants: weights dequantized to float32, torch matmuls and attention;
`RADIXGEN_DISABLE_NATIVE=1 --quantization unquant --dtype float32`), and `llama_cpp`
(llama-cpp-python's OpenAI server on the same GGUF, when installed; it serves one request at a
time). vLLM-CPU is not run: it does not install on these machines.

    python benchmark/bench_peers.py [--repeats 2] [--servers radixgen,llama_cpp] [--quick]
                                    [--results benchmark/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import jsonschema
from server_launch import free_port, launch_server, wait_until_up
from serving_workload import content_piece, random_text, sse_events

SERVERS = ("radixgen", "radixgen_f32_torch", "llama_cpp")
WORKLOADS = ("single", "concurrent32", "shared_prefix", "json_schema")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
# ours streams by token; llama.cpp's server by token too: a stream chunk is one token for both


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


# --- servers -------------------------------------------------------------------------------------


def start_server(name: str, threads: int) -> tuple[subprocess.Popen, str]:
    """Start server `name` and wait until it answers; -> (process, base URL)."""
    if name == "radixgen":
        return launch_server([])
    if name == "radixgen_f32_torch":
        os.environ["RADIXGEN_DISABLE_NATIVE"] = "1"  # the child inherits it
        try:
            return launch_server(["--quantization", "unquant", "--dtype", "float32"])
        finally:
            del os.environ["RADIXGEN_DISABLE_NATIVE"]
    from radixgen.runtime.model_loader.resolve import default_model_file

    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_file()),
           "--port", str(port), "--n_threads", str(threads), "--n_ctx", "4096",
           "--model_alias", "default", "--verbose", "False",
           "--interrupt_requests", "False"]  # queue, not cut, concurrent requests  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/v1/models", 120)
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- one streamed request ------------------------------------------------------------------------


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[list[float], str, float]:
    """POST a streamed request -> (arrival time of each content chunk, the text, start time)."""
    body = {**body, "stream": True}
    stamps: list[float] = []
    text: list[str] = []
    start = time.perf_counter()
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for data in sse_events(resp):
            choices = data.get("choices") or []
            piece = content_piece(choices[0]) if choices else None
            if piece:
                stamps.append(time.perf_counter())
                text.append(piece)
    return stamps, "".join(text), start


async def gather_limited(coros: list[Any], limit: int) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


# --- workloads -----------------------------------------------------------------------------------


async def single(session: aiohttp.ClientSession, base: str, rep: int, new: int) -> dict[str, Any]:
    body = {"model": "default", "max_tokens": new, "temperature": 0,
            "messages": [{"role": "user", "content":
                          f"Write a long story about a lighthouse keeper (#{rep})."}]}  # fmt: skip
    stamps, _, _ = await stream(session, base + "/v1/chat/completions", body)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {"decode_tok_s": round(rate, 1), "tokens": len(stamps)}


async def concurrent(
    session: aiohttp.ClientSession, base: str, rep: int, n: int, new: int, server: str
) -> dict[str, Any]:
    rng = random.Random(100 + rep)
    bodies = [{"model": "default", "prompt": random_text(rng, 64), "max_tokens": new,
               "temperature": 0} for _ in range(n)]  # fmt: skip
    if server.startswith("radixgen"):
        for b in bodies:
            b["ignore_eos"] = True  # llama.cpp's server has no such option
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(stream(session, base + "/v1/completions", b) for b in bodies))
    dur = time.perf_counter() - t0
    tokens = sum(len(s) for s, _, _ in outs)
    return {"output_tok_s": round(tokens / dur, 1), "tokens": tokens, "duration_s": round(dur, 2)}


async def shared_prefix(
    session: aiohttp.ClientSession, base: str, rep: int, n: int, prefix_words: int
) -> dict[str, Any]:
    rng = random.Random(200 + rep)  # a fresh prefix per repetition: no cache carried over
    prefix = random_text(rng, prefix_words)
    bodies = [{"model": "default", "prompt": prefix + "\n" + random_text(rng, 32),
               "max_tokens": 16, "temperature": 0} for _ in range(n)]  # fmt: skip
    t0 = time.perf_counter()
    outs = await gather_limited(
        [stream(session, base + "/v1/completions", b) for b in bodies], limit=16
    )
    dur = time.perf_counter() - t0
    ttfts = sorted(s[0] - start for s, _, start in outs if s)
    return {"req_s": round(n / dur, 3), "duration_s": round(dur, 2),
            "ttft_p50_s": round(ttfts[len(ttfts) // 2], 2)}  # fmt: skip


async def json_schema(
    session: aiohttp.ClientSession, base: str, rep: int, n: int, server: str
) -> dict[str, Any]:
    if server == "llama_cpp":  # llama-cpp-python's form of a schema-constrained reply
        fmt: dict[str, Any] = {"type": "json_object", "schema": SCHEMA}
    else:
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    bodies = [{"model": "default", "max_tokens": 64, "temperature": 0, "response_format": fmt,
               "messages": [{"role": "user", "content":
                             f"Invent a person #{rep * n + i}: name, age and city, as JSON."}]}
              for i in range(n)]  # fmt: skip
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(stream(session, base + "/v1/chat/completions", b) for b in bodies)
    )
    dur = time.perf_counter() - t0
    valid = 0
    for _, text, _ in outs:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    tokens = sum(len(s) for s, _, _ in outs)
    return {"output_tok_s": round(tokens / dur, 1), "valid": f"{valid}/{n}",
            "duration_s": round(dur, 2)}  # fmt: skip


async def run_workloads(base: str, server: str, rep: int, quick: bool) -> dict[str, Any]:
    new = 32 if quick else 128
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        # warm-up: one short request (first-call costs are not what is measured)
        await stream(session, base + "/v1/completions",
                     {"model": "default", "prompt": "Hello", "max_tokens": 4})  # fmt: skip
        out: dict[str, Any] = {}
        out["single"] = await single(session, base, rep, new)
        out["concurrent32"] = await concurrent(session, base, rep, 32, new, server)
        out["shared_prefix"] = await shared_prefix(
            session, base, rep, 16 if quick else 64, 300 if quick else 1500
        )
        out["json_schema"] = await json_schema(session, base, rep, 16, server)
        return out


# --- report --------------------------------------------------------------------------------------

HEADLINE = {
    "single": ("decode_tok_s", "single stream, 128 tokens, decode tok/s"),
    "concurrent32": ("output_tok_s", "32 concurrent x 128 tokens, output tok/s"),
    "shared_prefix": ("req_s", "64 requests sharing a 1,500-token prefix, 16 in flight, req/s"),
    "json_schema": ("output_tok_s", "16 JSON-schema requests, output tok/s (valid)"),
}


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    servers = [s for s in SERVERS if s in results]
    lines = ["| workload | " + " | ".join(servers) + " |", "|---" * (len(servers) + 1) + "|"]
    for w, (metric, label) in HEADLINE.items():
        cells = []
        for s in servers:
            vals = " · ".join(str(r[w][metric]) for r in results[s])
            if w == "json_schema":
                vals += " (" + ", ".join(r[w]["valid"] for r in results[s]) + ")"
            cells.append(vals)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def ratios(results: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Best-of-repetitions ratios of `radixgen` to each peer, per workload."""
    out: dict[str, float] = {}
    if "radixgen" not in results:
        return out
    for w, (metric, _) in HEADLINE.items():
        ours = max(r[w][metric] for r in results["radixgen"])
        for peer in results:
            if peer != "radixgen":
                theirs = max(r[w][metric] for r in results[peer])
                out[f"{w}_vs_{peer}"] = round(ours / theirs, 2) if theirs else float("inf")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--quick", action="store_true", help="shorter outputs and prefix (smoke run)")
    ap.add_argument("--results", default=None, help="append a Markdown section to this file")
    args = ap.parse_args()
    servers = args.servers.split(",")
    if unknown := set(servers) - set(SERVERS):
        ap.error(f"unknown servers {sorted(unknown)}")
    if "llama_cpp" in servers:
        try:
            import llama_cpp.server  # type: ignore[import-not-found,import-untyped]  # noqa: F401
        except ImportError:
            emit({"server": "llama_cpp", "skipped": "llama-cpp-python[server] is not installed"})
            servers.remove("llama_cpp")
    from bench_quant import cpu_kind  # type: ignore[import-not-found]

    threads = len(os.sched_getaffinity(0))
    emit({"bench": "machine", "cpu": cpu_kind(), "cores": threads})
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in servers}
    for rep in range(args.repeats):
        order = servers if rep % 2 == 0 else servers[::-1]
        for name in order:
            proc, base = start_server(name, threads)
            try:
                if name.startswith("radixgen"):
                    info = httpx.get(base + "/server_info", timeout=10).json()
                    emit({"server": name, "quantization": info.get("quantization"),
                          "dtype": info.get("dtype"), "kernel_isa": info.get("kernel_isa")})  # fmt: skip
                out = asyncio.run(run_workloads(base, name, rep, args.quick))
            finally:
                stop_server(proc)
            results[name].append(emit({"server": name, "repeat": rep, **out}))
    summary = emit({"bench": "summary", **ratios(results)})
    lines = table(results)
    print("\n".join(lines))
    if args.results:
        section = [
            "",
            "## RadixGen against its CPU peers over HTTP (bench_peers.py)",
            "",
            f"`python {' '.join(sys.argv)}` ({time.strftime('%Y-%m-%d')}; CPU {cpu_kind()}, "
            f"{threads} cores; repetitions in order, servers alternating)",
            "",
            *lines,
            "",
            "Ratios (best repetition of radixgen / best of the peer): "
            + ", ".join(f"{k} {v}" for k, v in summary.items() if k != "bench"),
            "",
        ]
        with Path(args.results).open("a") as f:
            f.write("\n".join(section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
