"""Interactive time to first token while a batch saturates the engine (issue 32 part 3).

One in-process Engine. Batch lines (8 shared ~prefixes, distinct documents) are sent as the
Batch API sends them: background work, at most --in-flight at a time, refilled as each finishes.
Interactive probes are streamed one after another, and each one's TTFT (submit to first chunk)
is measured: first on the idle engine, then under the batch. The figure is the ratio of median
TTFTs, under the batch / idle (target <= 2). `--control` repeats the loaded phase with the batch
lines sent as ordinary interactive requests (no tier), to show what the tier buys.

    python benchmark/bench_priority.py [--lines 96] [--in-flight 32] [--probes 6] [--control]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import radixgen
from radixgen.io_struct import GenerateReqInput

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _ttft(tm: Any, prompt: str, max_new_tokens: int) -> float:
    sp = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    obj = GenerateReqInput(text=prompt, sampling_params=sp, stream=True)
    start = time.perf_counter()
    first: float | None = None
    async for _ in tm.generate(obj):
        if first is None:
            first = time.perf_counter() - start
    assert first is not None
    return first


async def _probes(tm: Any, rng: random.Random, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(await _ttft(tm, "Question: " + _text(rng, 40) + "\nAnswer:", 8))
        await asyncio.sleep(0.2)
    return out


async def _loaded(tm: Any, args: argparse.Namespace, background: bool) -> tuple[list[float], int]:
    rng = random.Random(1)
    prefixes = [f"System {k}: " + _text(rng, args.prefix_words) for k in range(8)]
    lines = [p + "\nDocument: " + _text(rng, 60) for p in prefixes for _ in range(args.lines // 8)]
    slots = asyncio.Semaphore(args.in_flight)
    done = 0

    async def line(prompt: str) -> None:
        nonlocal done
        async with slots:
            sp = {"max_new_tokens": args.line_tokens, "temperature": 0, "ignore_eos": True}
            obj = GenerateReqInput(text=prompt, sampling_params=sp, background=background)
            async for _ in tm.generate(obj):
                pass
            done += 1

    batch = asyncio.gather(*(line(p) for p in lines))
    await asyncio.sleep(args.warmup)  # the batch fills the engine
    ttfts = await _probes(tm, random.Random(2), args.probes)
    finished_during = done
    batch.cancel()
    try:
        await batch
    except asyncio.CancelledError:
        pass
    return ttfts, finished_during


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=96)
    ap.add_argument("--in-flight", type=int, default=32, help="as --batch-max-in-flight")
    ap.add_argument("--prefix-words", type=int, default=300)
    ap.add_argument("--line-tokens", type=int, default=64)
    ap.add_argument("--probes", type=int, default=6)
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds of batch before probing")
    ap.add_argument("--control", action="store_true", help="also: batch lines without the tier")
    args = ap.parse_args()
    with radixgen.Engine(grammar_backend="none", log_level="warning") as eng:
        tm = eng.tokenizer_manager
        eng.run(_probes(tm, random.Random(3), 2))  # warm-up
        idle = eng.run(_probes(tm, random.Random(2), args.probes))
        loaded, done = eng.run(_loaded(tm, args, background=True))
        rows = [("idle", idle, None), ("batch as background (ours)", loaded, done)]
        if args.control:
            eng.flush_cache()
            ctl, cdone = eng.run(_loaded(tm, args, background=False))
            rows.append(("batch as interactive (control)", ctl, cdone))
    for name, ts, _ in rows:
        print(f"{name}: " + " ".join(f"{t * 1000:.0f}" for t in ts) + " ms")
    base = statistics.median(idle)
    print("| phase | median TTFT (ms) | max TTFT (ms) | vs idle | batch lines done while probing |")
    print("|---|---|---|---|---|")
    for name, ts, n in rows:
        med = statistics.median(ts)
        print(f"| {name} | {med * 1000:.0f} | {max(ts) * 1000:.0f} | {med / base:.2f}x | "
              f"{'' if n is None else n} |")  # fmt: skip


if __name__ == "__main__":
    main()
