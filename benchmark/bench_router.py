"""What `radixgen router` costs in front of the servers: the same requests sent to a server
directly and through the router, in one run, alternating.

Starts a generation server (the default model) and an embedding server (all-MiniLM-L6-v2), and a
router in front of both. Measures single-request latency of a short `/v1/embeddings` call, the
throughput of 32 concurrent embedding clients, and a streamed chat completion's time to first
token and total time. On a 2-core machine the router's process shares the cores with the
servers, so its overhead shows as it would on a small node.

    python benchmark/bench_router.py --results benchmark/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import httpx
import psutil
from benchmark_results import replace_section
from server_launch import free_port, launch_server, wait_until_up

TEXT = "Retrieval-augmented generation embeds the query and the passages."


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def single_embeddings(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(n):
            t = time.perf_counter()
            r = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": TEXT})
            r.raise_for_status()
            out.append(time.perf_counter() - t)
    return out


async def concurrent_embeddings(url: str, clients: int, seconds: float) -> float:
    """Requests per second of `clients` loops sending one text each for `seconds`."""
    done = 0
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def loop(k: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                body = {"model": "all-MiniLM-L6-v2", "input": f"{TEXT} ({k}, {done})"}
                r = await client.post("/v1/embeddings", json=body)
                r.raise_for_status()
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop(k) for k in range(clients)))
        return done / (time.perf_counter() - start)


def streamed_chat(url: str, model: str, n: int) -> tuple[list[float], list[float]]:
    ttft, total = [], []
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name three uses of a radix tree."}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(n):
            t = time.perf_counter()
            first = None
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.perf_counter() - t
            assert first is not None
            ttft.append(first)
            total.append(time.perf_counter() - t)
    return ttft, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="direct / router alternations")
    ap.add_argument("--single", type=int, default=100, help="single embedding requests a round")
    ap.add_argument("--load-seconds", type=float, default=10.0)
    ap.add_argument("--chats", type=int, default=5, help="streamed chats a round")
    ap.add_argument("--results", help="write a section to this RESULTS.md")
    ns = ap.parse_args()

    common = ["--num-threads", "1"]
    gen, gen_url = launch_server([*common, "--max-total-tokens", "4096"])
    emb, emb_url = launch_server([*common, "--is-embedding"])
    port = free_port()
    router_url = f"http://127.0.0.1:{port}"
    router = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixgen.cli",
            "router",
            "--worker-urls",
            gen_url,
            emb_url,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    )
    try:
        wait_until_up(router, router_url + "/health", 60)
        model = httpx.get(gen_url + "/v1/models").json()["data"][0]["id"]
        streamed_chat(gen_url, model, 1)  # the prompt's prefix cached once for both modes
        router_cpu = psutil.Process(router.pid)
        cpu_ms: list[float] = []  # the router's CPU time per request under the 32-client load
        single: dict[str, list[float]] = {"direct": [], "router": []}
        load: dict[str, list[float]] = {"direct": [], "router": []}
        ttft: dict[str, list[float]] = {"direct": [], "router": []}
        total: dict[str, list[float]] = {"direct": [], "router": []}
        for rnd in range(ns.rounds):
            for mode, e_url, g_url in (("direct", emb_url, gen_url), ("router", router_url, router_url)):  # fmt: skip
                single[mode] += single_embeddings(e_url, ns.single)
                cpu0 = sum(router_cpu.cpu_times()[:2])
                rate = asyncio.run(concurrent_embeddings(e_url, 32, ns.load_seconds))
                load[mode].append(rate)
                if mode == "router":
                    used = sum(router_cpu.cpu_times()[:2]) - cpu0
                    cpu_ms.append(used * 1e3 / (rate * ns.load_seconds))
                a, b = streamed_chat(g_url, model, ns.chats)
                ttft[mode] += a
                total[mode] += b
                print(f"round {rnd} {mode}: single p50 {p50(single[mode]) * 1e3:.1f} ms, "
                      f"32 clients {load[mode][-1]:.1f} req/s, TTFT p50 {p50(ttft[mode]) * 1e3:.0f} ms",
                      flush=True)  # fmt: skip
    finally:
        for proc in (router, gen, emb):
            proc.terminate()
        for proc in (router, gen, emb):
            proc.wait(30)

    def row(name: str, d: float, r: float, unit: str, better_low: bool = True) -> str:
        ratio = r / d if better_low else d / r
        return f"| {name} | {d:.1f} {unit} | {r:.1f} {unit} | {ratio:.3f}x |"

    lines = [
        f"Command: `python benchmark/bench_router.py --rounds {ns.rounds} --single {ns.single} "
        f"--load-seconds {ns.load_seconds:g} --chats {ns.chats}`. {_machine()}",
        "",
        "| measure | direct | through `radixgen router` | router / direct (cost) |",
        "|---|---|---|---|",
        row(
            "`/v1/embeddings`, one short text, p50",
            p50(single["direct"]) * 1e3,
            p50(single["router"]) * 1e3,
            "ms",
        ),
        row(
            "`/v1/embeddings`, one short text, p99",
            _p99(single["direct"]) * 1e3,
            _p99(single["router"]) * 1e3,
            "ms",
        ),
        row(
            "32 concurrent embedding clients, best round",
            max(load["direct"]),
            max(load["router"]),
            "req/s",
            better_low=False,
        ),
        row(
            "streamed chat (32 tokens), TTFT p50",
            p50(ttft["direct"]) * 1e3,
            p50(ttft["router"]) * 1e3,
            "ms",
        ),
        row(
            "streamed chat (32 tokens), total p50",
            p50(total["direct"]) * 1e3,
            p50(total["router"]) * 1e3,
            "ms",
        ),
    ]
    lines += [
        "",
        f"The router's own CPU time under the 32-client load: {min(cpu_ms):.2f} ms a request "
        "(best round; uvicorn in, aiohttp out, one process).",
    ]
    text = "\n".join(lines)
    print(text)
    if ns.results:
        replace_section(ns.results, "Model router overhead (bench_router.py)", text)


def _machine() -> str:
    flags = sorted(set(os.popen("grep -o 'avx512_bf16\\|avx2' /proc/cpuinfo").read().split()))
    return f"CPU flags: {', '.join(flags)}; {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}."


def _p99(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


if __name__ == "__main__":
    main()
