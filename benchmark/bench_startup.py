"""Time to ready of an in-process Engine (the default model), before / after in one run.

What a user waits for in a notebook or a script, and what each of the test suite's engines
costs: `radixgen.Engine(...)` returning (children started, model loaded, scheduler ready), with
the default grammar backend and with `grammar_backend="none"` (nothing to build: the floor).
The baseline is another checkout (`--base-python`: a venv with it installed editable), starts
alternating base, new, base, new; medians and new/base ratios are printed and, with --results,
written to benchmark/RESULTS.md.

    python benchmark/bench_startup.py [--base DIR --base-python PY] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_host_step import cpu_kind
from benchmark_results import replace_section

BACKENDS = ("xgrammar", "none")


def measure(backend: str) -> float:
    import radixgen

    t0 = time.perf_counter()
    with radixgen.Engine(log_level="warning", grammar_backend=backend):
        ready = time.perf_counter() - t0
    return ready


def run_worker(python: str, backend: str) -> float:
    cmd = [python, str(Path(__file__).resolve()), "--worker", backend]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"{python}: the start failed\n{proc.stderr[-3000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="the baseline checkout (for the report)")
    ap.add_argument("--base-python", help="an interpreter with --base installed editable")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--results", type=Path, help="append a section to this RESULTS.md")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(measure(args.worker), flush=True)
        return 0
    sides = {"new": sys.executable}
    if args.base_python:
        sides = {"base": args.base_python, **sides}
    runs: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for backend in BACKENDS:
            for side, python in sides.items():
                seconds = run_worker(python, backend)
                runs.setdefault(f"{side}_{backend}_s", []).append(seconds)
                record = {"round": rnd, "side": side, "grammar_backend": backend, "s": seconds}
                print(json.dumps(record), flush=True)
    summary: dict[str, Any] = {"cpu": cpu_kind(), "rounds": args.rounds}
    summary |= {key: statistics.median(values) for key, values in runs.items()}
    if "base" in sides:
        for backend in BACKENDS:
            summary[f"{backend}_ratio"] = summary[f"new_{backend}_s"] / summary[f"base_{backend}_s"]
    print(json.dumps(summary), flush=True)
    if args.results is not None:
        write_results(args.results, summary, args.base)
    return 0


def write_results(path: Path, s: dict[str, Any], base: Path | None) -> None:
    def cell(key: str, fmt: str) -> str:
        return format(s[key], fmt) if key in s else "-"

    rows = [
        f"| {b} | {cell(f'base_{b}_s', '.2f')} | {cell(f'new_{b}_s', '.2f')} | "
        f"{cell(f'{b}_ratio', '.2f')}x |"
        for b in BACKENDS
    ]
    body = "\n".join(
        [
            f"CPU: {s['cpu']}; the default model, `radixgen.Engine(...)` until it returns, median "
            f"of {s['rounds']} alternating starts. Baseline: {base or 'none'}.",
            "",
            "| grammar backend | base s | new s | new / base |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    replace_section(path, "Engine start, time to ready (bench_startup.py)", body)


if __name__ == "__main__":
    sys.exit(main())
