"""Single-stream decode on a shared machine: the adaptive kernel team against a fixed one.

On a machine whose cores another process also wants, every parallel region of a decode step
waits for the thread that was kept off a CPU (kernels/cpu/team.c). This runs the default model
(an in-process Engine, streamed greedy decode of `--tokens` tokens, best of `--repeats`) with
the adaptive team (the default) and with RADIXGEN_CPU_ADAPTIVE_TEAM=0 (a fixed team, what ran
before), alternating, on a quiet machine and beside `--busy` busy-looping processes; the
ratios adaptive / fixed are printed and, with --results, written to benchmark/RESULTS.md.

    python benchmark/bench_contention.py [--rounds 2] [--busy 1] [--results benchmark/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_host_step import cpu_kind
from benchmark_results import replace_section

PROMPT = "Write a long story about a dragon and a knight."
MODES = {"adaptive": "1", "fixed": "0"}


def measure(tokens: int, repeats: int, batch: int) -> float:
    """Best decode rate (tok/s) of one Engine: one streamed request (batch 1), or `batch`
    requests at once (output tokens / wall time); the env is set by the parent."""
    import radixgen

    params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    best = 0.0
    with radixgen.Engine(log_level="warning") as engine:
        engine.generate(PROMPT, {**params, "max_new_tokens": 4})
        for _ in range(repeats):
            engine.flush_cache()
            if batch > 1:
                prompts = [f"{PROMPT} Chapter {i}." for i in range(batch)]
                t = time.perf_counter()
                outs = engine.generate(prompts, params)
                best = max(
                    best, sum(len(o["output_ids"]) for o in outs) / (time.perf_counter() - t)
                )
                continue
            stamps = []
            for chunk in engine.generate(PROMPT, params, stream=True):
                stamps.append((time.perf_counter(), chunk["meta_info"]["completion_tokens"]))
            (t0, n0), (t1, n1) = stamps[0], stamps[-1]
            best = max(best, (n1 - n0) / (t1 - t0))
    return best


def spin() -> None:
    while True:
        pass


def run_worker(mode: str, tokens: int, repeats: int, batch: int) -> float:
    env = {**os.environ, "RADIXGEN_CPU_ADAPTIVE_TEAM": MODES[mode]}
    worker = [str(tokens), str(repeats), str(batch)]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *worker]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} run failed\n{proc.stderr[-3000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--busy", type=int, default=1, help="busy-looping processes beside")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2, help="runs per Engine (best kept)")
    ap.add_argument("--batch", type=int, default=1, help="requests at once (1: one stream)")
    ap.add_argument("--results", type=Path, help="write a section into this RESULTS.md")
    ap.add_argument("--worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(measure(*args.worker), flush=True)
        return 0
    runs: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for load in ("quiet", "busy"):
            spinners = []
            if load == "busy":
                spinners = [
                    multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)
                ]
                for p in spinners:
                    p.start()
            try:
                for mode in MODES:
                    rate = run_worker(mode, args.tokens, args.repeats, args.batch)
                    runs.setdefault(f"{load}_{mode}", []).append(rate)
                    print(json.dumps({"round": rnd, "load": load, "mode": mode, "tok_s": rate}))
            finally:
                for p in spinners:
                    p.kill()
    summary: dict[str, Any] = {"cpu": cpu_kind(), "cores": os.cpu_count(), "busy": args.busy}
    summary["batch"] = args.batch
    summary |= {key: statistics.median(values) for key, values in runs.items()}
    summary |= {f"{key}_runs": values for key, values in runs.items()}
    for load in ("quiet", "busy"):
        summary[f"{load}_ratio"] = summary[f"{load}_adaptive"] / summary[f"{load}_fixed"]
    print(json.dumps(summary), flush=True)
    if args.results is not None:
        write_results(args.results, summary, args)
    return 0


def write_results(path: Path, s: dict[str, Any], args: argparse.Namespace) -> None:
    def runs(key: str) -> str:
        return " / ".join(f"{v:.1f}" for v in s[f"{key}_runs"])

    rows = [
        f"| {load} | {runs(f'{load}_adaptive')} | {runs(f'{load}_fixed')} | "
        f"**{s[f'{load}_ratio']:.2f}x** |"
        for load in ("quiet", "busy")
    ]
    what = (
        f"streamed greedy decode of {args.tokens} tokens"
        if args.batch == 1
        else f"{args.batch} requests of {args.tokens} greedy tokens at once (output tok/s)"
    )
    body = "\n".join(
        [
            f"CPU: {s['cpu']}, {s['cores']} cores; the default model (Q4_1 kept quantized), an "
            f"in-process Engine, {what}, best of {args.repeats} runs per Engine, "
            f"{args.rounds} alternating rounds; busy = {s['busy']} busy-looping process(es) "
            f"beside. Command: `python benchmark/bench_contention.py --rounds {args.rounds} "
            f"--busy {s['busy']} --batch {args.batch} --tokens {args.tokens} --repeats "
            f"{args.repeats}`.",
            "",
            "| machine | adaptive team tok/s (rounds) | fixed team tok/s (rounds) | "
            "adaptive / fixed (medians) |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    title = "Decode on a shared machine: the adaptive kernel team (bench_contention.py)"
    replace_section(path, title if args.batch == 1 else f"{title}, batch {args.batch}", body)


if __name__ == "__main__":
    sys.exit(main())
