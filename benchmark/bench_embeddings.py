"""Embedding throughput and latency: `radixgen serve --is-embedding` against sentence-transformers
on the same model (all-MiniLM-L6-v2, the bundled default), in one run.

- texts/s at batch 1, 32 and 256, with ~64- and ~256-token texts: ours one `/v1/embeddings`
  request of `batch` inputs over HTTP (so ours pays tokenizing, IPC and JSON), theirs
  `SentenceTransformer.encode(texts, batch_size=batch)` in this process; alternating per repeat;
- p50 / p99 latency of single-text requests while 32 clients send them back to back (ours).

Both sides get the machine's cores (torch's intra-op threads for sentence-transformers, the
server's --num-threads for ours). Target (issue 33): >= 1.5x at batch 256, >= 1x at batch 1.

    python benchmark/bench_embeddings.py [--repeats 2] [--results benchmark/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from server_launch import launch_server
from serving_workload import random_text

BATCHES = (1, 32, 256)
LENGTHS = {"64tok": 44, "256tok": 180}  # words per text: ~64 and ~256 word-piece tokens
CLIENTS = 32


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [random_text(rng, words) for _ in range(n)]


def ours(http: httpx.Client, batch: list[str], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        r = http.post("/v1/embeddings", json={"model": "default", "input": batch})
        r.raise_for_status()
    return rounds * len(batch) / (time.perf_counter() - start)


def theirs(model: Any, batch: list[str], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        model.encode(batch, batch_size=len(batch), normalize_embeddings=True)
    return rounds * len(batch) / (time.perf_counter() - start)


async def latency_under_load(base: str, seconds: float) -> dict[str, float]:
    pool = texts(256, LENGTHS["64tok"], 7)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:

        async def client(i: int) -> None:
            n = i
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                r = await http.post(
                    "/v1/embeddings", json={"model": "default", "input": pool[n % 256]}
                )
                r.raise_for_status()
                latencies.append(time.perf_counter() - start)
                n += CLIENTS

        await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    latencies.sort()
    return {"requests": len(latencies), "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--load-seconds", type=float, default=20)
    ap.add_argument("--results", default=None, help="append a Markdown section to this file")
    args = ap.parse_args()
    import torch
    from bench_quant import cpu_kind  # type: ignore[import-not-found]
    from sentence_transformers import SentenceTransformer

    from radixgen.runtime.model_loader.default_embedding import unpack_default_embedding_model
    from radixgen.utils import cache_root

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    folder = unpack_default_embedding_model(cache_root() / "models")
    model = SentenceTransformer(str(folder), device="cpu")
    emit({"bench": "machine", "cpu": cpu_kind(), "threads": threads, "model": folder.name})
    proc, base = launch_server(["--is-embedding", "--num-threads", str(threads)])
    rows: dict[tuple[str, int], dict[str, list[float]]] = {}
    try:
        with httpx.Client(base_url=base, timeout=300) as http:
            for length, words in LENGTHS.items():
                for b in BATCHES:
                    batch = texts(b, words, b)
                    rounds = max(1, 64 // b)
                    ours(http, batch, 1), theirs(model, batch, 1)  # warm both
                    cell = rows.setdefault((length, b), {"ours": [], "theirs": []})
                    for rep in range(args.repeats):
                        sides = ["ours", "theirs"] if rep % 2 == 0 else ["theirs", "ours"]
                        for side in sides:
                            rate = (ours(http, batch, rounds) if side == "ours"
                                    else theirs(model, batch, rounds))  # fmt: skip
                            cell[side].append(rate)
                    emit({"texts": length, "batch": b,
                          **{k: round(max(v), 1) for k, v in cell.items()},
                          "ratio": round(max(cell["ours"]) / max(cell["theirs"]), 2)})  # fmt: skip
        load = emit({"bench": "latency", "clients": CLIENTS,
                     **asyncio.run(latency_under_load(base, args.load_seconds))})  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(60)
    if args.results:
        lines = ["", "## Embeddings: radixgen against sentence-transformers (bench_embeddings.py)",
                 "", f"`python {' '.join(sys.argv)}` ({time.strftime('%Y-%m-%d')}; CPU "
                 f"{cpu_kind()}, {threads} threads; best of {args.repeats}, sides alternating)", "",
                 "| texts | batch | radixgen texts/s | sentence-transformers texts/s | ratio |",
                 "|---|---|---|---|---|"]  # fmt: skip
        for (length, b), cell in rows.items():
            lines.append(f"| {length} | {b} | {max(cell['ours']):.1f} | {max(cell['theirs']):.1f} "
                         f"| {max(cell['ours']) / max(cell['theirs']):.2f}x |")  # fmt: skip
        lines += ["", f"Single-text requests from {CLIENTS} concurrent clients: p50 "
                  f"{load['p50_ms']} ms, p99 {load['p99_ms']} ms ({load['requests']} requests).", ""]  # fmt: skip
        with Path(args.results).open("a") as f:
            f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
