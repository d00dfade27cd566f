"""Online serving benchmark: an async load generator for any OpenAI-compatible server.

Sends streamed /v1/completions (or /v1/chat/completions) requests from a random or shared-prefix
dataset, either with a fixed number in flight (--concurrency) or as a Poisson process
(--request-rate), and prints one JSON line per run: throughput and TTFT / ITL / end-to-end
latency percentiles. With --launch-server it starts RadixGen itself (and reports the CPU time of
the API process vs the engine); with --compare-engine it then runs the same workload through the
offline `radixgen.Engine` (no HTTP) and prints the HTTP / Engine throughput ratio.

Examples:
  python benchmark/bench_serving.py --base-url http://127.0.0.1:30000 --concurrency 8
  python benchmark/bench_serving.py --launch-server --compare-engine --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

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
    error: str = ""


def random_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def build_dataset(args: argparse.Namespace, n: int) -> list[Sample]:
    rng = random.Random(args.seed)
    if args.dataset == "random":
        return [Sample(random_text(rng, args.input_len), args.output_len) for _ in range(n)]
    prefixes = [random_text(rng, args.prefix_len) for _ in range(args.num_groups)]
    return [
        Sample(
            prefixes[i % args.num_groups] + "\n" + random_text(rng, args.input_len), args.output_len
        )
        for i in range(n)
    ]


# --- HTTP client ---------------------------------------------------------------------------------


async def http_request(
    session: aiohttp.ClientSession, args: argparse.Namespace, model: str, s: Sample
) -> Result:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": s.output_len,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint == "chat":
        url = args.base_url + "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": s.prompt}]
    else:
        url = args.base_url + "/v1/completions"
        body["prompt"] = s.prompt
    res = Result()
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with session.post(url, json=body, headers=args.headers) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                data = json.loads(payload)
                if "error" in data:
                    res.error = str(data["error"])[:200]
                    return res
                if data.get("usage"):
                    res.prompt_tokens = data["usage"]["prompt_tokens"]
                    res.output_tokens = data["usage"]["completion_tokens"]
                choices = data.get("choices") or []
                if not choices:
                    continue
                c = choices[0]
                piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itls.append(now - last)
                    last = now
                    chunks += 1
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        res.error = repr(e)
        return res
    res.e2e = time.perf_counter() - start
    res.output_tokens = res.output_tokens or chunks
    res.ok = True
    return res


# --- offline Engine client (same workload, no HTTP) ----------------------------------------------


async def engine_request(engine: Any, args: argparse.Namespace, s: Sample) -> Result:
    sp = {
        "max_new_tokens": s.output_len,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
    }
    res = Result()
    start = last = time.perf_counter()
    seen = 0
    try:
        stream = await engine.async_generate(s.prompt, sp, stream=True)
        async for chunk in stream:
            meta = chunk["meta_info"]
            n = meta["completion_tokens"]
            if n > seen:
                now = time.perf_counter()
                if seen == 0:
                    res.ttft = now - start
                else:
                    res.itls.append(now - last)
                last, seen = now, n
            res.prompt_tokens = meta["prompt_tokens"]
    except Exception as e:
        res.error = repr(e)
        return res
    res.e2e = time.perf_counter() - start
    res.output_tokens = seen
    res.ok = True
    return res


# --- load generation -----------------------------------------------------------------------------


async def run_load(
    send: Any, samples: list[Sample], concurrency: int | None, rate: float
) -> tuple[list[Result], float]:
    rng = random.Random(0)
    limit = asyncio.Semaphore(concurrency or len(samples))

    async def one(s: Sample) -> Result:
        async with limit:
            return await send(s)

    start = time.perf_counter()
    tasks = []
    for s in samples:
        tasks.append(asyncio.create_task(one(s)))
        if rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


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


# --- server launch and CPU accounting ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(server_args: list[str]) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "radixgen.launch_server",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *server_args,
    ]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become healthy")


def cpu_times(pid: int) -> dict[str, float]:
    """CPU seconds of the API process and of each engine child, by role."""
    import psutil

    p = psutil.Process(pid)
    out = {"api": sum(p.cpu_times()[:2])}
    for c in p.children():
        role = "scheduler" if "scheduler" in " ".join(c.cmdline()) else "detokenizer"
        out[role] = sum(c.cpu_times()[:2])
    return out


async def resolve_model(session: aiohttp.ClientSession, args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    async with session.get(args.base_url + "/v1/models", headers=args.headers) as r:
        return (await r.json())["data"][0]["id"]


async def bench_http(args: argparse.Namespace, pid: int | None) -> list[dict[str, Any]]:
    lines = []
    timeout = aiohttp.ClientTimeout(total=3600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = await resolve_model(session, args)
        for conc in args.concurrency:
            n = args.num_prompts or max(16, 4 * conc)
            samples = build_dataset(args, n)
            await run_load(
                lambda s: http_request(session, args, model, s), samples[:2], 2, float("inf")
            )
            before = cpu_times(pid) if pid else None
            results, dur = await run_load(
                lambda s: http_request(session, args, model, s), samples, conc, args.request_rate
            )  # fmt: skip
            extra = {"backend": "http", "endpoint": args.endpoint, "dataset": args.dataset,
                     "concurrency": conc, "request_rate": args.request_rate, "num_prompts": n}  # fmt: skip
            line = summarize(results, dur, extra)
            if before is not None:
                after = cpu_times(pid)
                for role in after:
                    line[f"{role}_cpu_s"] = round(after[role] - before.get(role, 0.0), 2)
            print(json.dumps(line), flush=True)
            lines.append(line)
    return lines


async def bench_engine(args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixgen.runtime.engine import Engine

    kwargs = json.loads(args.engine_kwargs) if args.engine_kwargs else {}
    engine = Engine(log_level="warning", **kwargs)
    lines = []
    try:
        for conc in args.concurrency:
            n = args.num_prompts or max(16, 4 * conc)
            samples = build_dataset(args, n)
            await run_load(lambda s: engine_request(engine, args, s), samples[:2], 2, float("inf"))
            results, dur = await run_load(
                lambda s: engine_request(engine, args, s), samples, conc, args.request_rate
            )  # fmt: skip
            extra = {"backend": "engine", "dataset": args.dataset, "concurrency": conc,
                     "request_rate": args.request_rate, "num_prompts": n}  # fmt: skip
            line = summarize(results, dur, extra)
            print(json.dumps(line), flush=True)
            lines.append(line)
    finally:
        engine.shutdown()
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--base-url",
        default="http://127.0.0.1:30000",
        help="Server to load (ignored with --launch-server).",
    )
    p.add_argument("--api-key", default=None, help="Bearer key for the server.")
    p.add_argument(
        "--model", default=None, help="Model name to send (default: the first of /v1/models)."
    )
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    p.add_argument(
        "--num-prompts",
        type=int,
        default=0,
        help="Requests per run (default: max(16, 4 x concurrency)).",
    )
    p.add_argument(
        "--input-len",
        type=int,
        default=128,
        help="Prompt words (~tokens) per request (after the shared prefix).",
    )
    p.add_argument("--output-len", type=int, default=64, help="max_tokens per request.")
    p.add_argument(
        "--prefix-len",
        type=int,
        default=512,
        help="shared-prefix: words in each group's shared prefix.",
    )
    p.add_argument(
        "--num-groups", type=int, default=4, help="shared-prefix: number of distinct prefixes."
    )
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[8],
        help="Requests in flight; one run per value.",
    )
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Poisson arrival rate (req/s); inf = all at once.",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="Let requests stop at EOS (default: exactly --output-len tokens).",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--launch-server", action="store_true", help="Start a RadixGen server for the run."
    )
    p.add_argument(
        "--server-args", default="", help="Extra flags for the launched server, one string."
    )
    p.add_argument(
        "--compare-engine",
        action="store_true",
        help="Also run the offline Engine and print HTTP/Engine ratios.",
    )
    p.add_argument(
        "--engine-kwargs",
        default="",
        help='Engine(**kwargs) as JSON, e.g. \'{"grammar_backend": "none"}\'.',
    )
    args = p.parse_args(argv)
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    proc = None
    if args.launch_server:
        proc, args.base_url = launch_server(args.server_args.split())
    try:
        http_lines = asyncio.run(bench_http(args, proc.pid if proc else None))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    if not args.compare_engine:
        return
    engine_lines = asyncio.run(bench_engine(args))
    for h, e in zip(http_lines, engine_lines, strict=True):
        ratio = h["output_throughput"] / e["output_throughput"] if e["output_throughput"] else 0.0
        print(json.dumps({"comparison": "http_vs_engine", "dataset": args.dataset, "concurrency": h["concurrency"],
                          "http_output_throughput": h["output_throughput"],
                          "engine_output_throughput": e["output_throughput"],
                          "ratio": round(ratio, 3)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
