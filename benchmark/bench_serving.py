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
import statistics
import sys
import time
from typing import Any

import aiohttp
from server_launch import launch_server
from serving_workload import Result, Sample, build_dataset, content_piece, sse_events, summarize

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
            async for data in sse_events(resp):
                if "error" in data:
                    res.error = str(data["error"])[:200]
                    return res
                if data.get("usage"):
                    res.prompt_tokens = data["usage"]["prompt_tokens"]
                    res.output_tokens = data["usage"]["completion_tokens"]
                    details = data["usage"].get("prompt_tokens_details") or {}
                    res.cached_tokens = details.get("cached_tokens") or 0
                choices = data.get("choices") or []
                if not choices:
                    continue
                piece = content_piece(choices[0])
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
            res.cached_tokens = meta.get("cached_tokens", 0)
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


# --- server launch and CPU accounting ------------------------------------------------------------


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


async def one_run(
    backend: str, send: Any, args: argparse.Namespace, conc: int, rep: int, pid: int | None
) -> dict[str, Any]:
    """Warm up with two requests, then run the workload once at `conc` and summarize it.

    Prompts depend on (seed, concurrency, repeat): a repeat never hits the prefix cache that an
    earlier run filled, and the HTTP and Engine runs of one repeat send the same prompts.
    """
    n = args.num_prompts or max(8, 4 * conc)
    samples = build_dataset(args, n, seed=args.seed + 1000 * rep + conc)
    await run_load(send, build_dataset(args, 2, seed=-1 - 1000 * rep - conc), 2, float("inf"))
    before = cpu_times(pid) if pid else None
    client_cpu = time.process_time()
    results, dur = await run_load(send, samples, conc, args.request_rate)
    client_cpu = time.process_time() - client_cpu
    extra = {"backend": backend, "endpoint": args.endpoint, "dataset": args.dataset,
             "concurrency": conc, "request_rate": args.request_rate, "num_prompts": n}  # fmt: skip
    line = summarize(results, dur, extra)
    line["client_cpu_s"] = round(client_cpu, 2)  # this process (with --compare-engine: + Engine's)
    if before is not None:
        after = cpu_times(pid)
        for role in after:
            line[f"{role}_cpu_s"] = round(after[role] - before.get(role, 0.0), 2)
    print(json.dumps(line), flush=True)
    return line


async def bench(args: argparse.Namespace, pid: int | None) -> None:
    """HTTP runs, and with --compare-engine the same workload through the Engine right after
    each one (interleaved, so both see the same machine load)."""
    engine = None
    if args.compare_engine:
        from radixgen.runtime.entrypoints.engine import Engine

        kwargs = json.loads(args.engine_kwargs) if args.engine_kwargs else {}
        engine = Engine(log_level="warning", **kwargs)
    timeout = aiohttp.ClientTimeout(total=3600)
    try:
        async with aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
        ) as session:
            model = await resolve_model(session, args)
            for conc in args.concurrency:
                ratios = []
                for rep in range(args.repeats):
                    line = await one_run(
                        "http", lambda s: http_request(session, args, model, s), args, conc, rep,
                        pid,
                    )  # fmt: skip
                    http_tp = line["output_throughput"]
                    if engine is not None:
                        line = await one_run(
                            "engine", lambda s: engine_request(engine, args, s), args, conc, rep,
                            None,
                        )  # fmt: skip
                        e = line["output_throughput"]
                        ratios.append(http_tp / e if e else 0.0)
                if ratios:  # back-to-back pairs share the machine's load; take the median pair
                    print(json.dumps({"comparison": "http_vs_engine", "dataset": args.dataset,
                                      "concurrency": conc, "ratios": [round(r, 3) for r in ratios],
                                      "ratio": round(statistics.median(ratios), 3)}), flush=True)  # fmt: skip
    finally:
        if engine is not None:
            engine.shutdown()


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
        help="Requests per run (default: max(8, 4 x concurrency)).",
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
        "--repeats",
        type=int,
        default=1,
        help="HTTP/Engine run pairs per concurrency (median ratio).",
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below
    proc = None
    if args.launch_server:
        proc, args.base_url = launch_server(args.server_args.split())
    try:
        asyncio.run(bench(args, proc.pid if proc else None))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
