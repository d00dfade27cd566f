"""The scheduler's host work per decode step at a large batch, before / after in one run.

On a GPU the decode step of a small model is host-bound at batch 256 (the H200 run: 3.7 ms of
host work a step, the device ~1 ms), so what the scheduler does per request per step in Python
(planning, building the batch, choosing the sampler's path, accepting tokens, collecting
outputs) sets the throughput. This measures that work on CPU, where it is the same code: a tiny
random model (its forward is small), B requests decoding 128 tokens greedily, and the scheduler's
own accounting: step time less the forward call and any wait for the device, per step. With
overlap scheduling on and off.

The baseline is another checkout measured in the same run (`git worktree add --detach DIR REV`
and a venv with that checkout installed editable), rounds alternating base, new, base, new so
that drift of a noisy machine hits both sides alike; medians and new/base ratios are printed and,
with --results, written to benchmark/RESULTS.md.

    python benchmark/bench_host_step.py [--base DIR --base-python PY] [--batch 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmark_results import replace_section

HERE = Path(__file__).resolve().parent
NEW_TOKENS = 128
PROMPT_TOKENS = 32


def measure(batch: int, overlap: bool, model_dir: str) -> dict[str, float]:
    """One engine, one warm-up, then 3 timed batches; the median host ms per step."""
    from random_model import build_random_model, random_prompts

    import radixgen

    folder = build_random_model(model_dir, tiny=True)
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    keys = ("forward_steps", "step_seconds", "device_wait_seconds", "forward_seconds")
    with radixgen.Engine(
        model_path=str(folder),
        device="cpu",
        grammar_backend="none",
        log_level="warning",
        max_running_requests=batch,
        max_total_tokens=batch * (PROMPT_TOKENS + NEW_TOKENS + 16),
        # NOTE: on CPU overlap scheduling runs only when asked for (it hides nothing there)
        enable_overlap_schedule=overlap,
        disable_overlap_schedule=not overlap,
    ) as eng:

        def totals() -> dict[str, float]:
            states = eng.get_server_info()["internal_states"]
            return {k: float(sum(s.get(k, 0) for s in states)) for k in keys}

        prompts = random_prompts(batch, PROMPT_TOKENS, 512, seed=1)
        eng.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 4})
        host, wall = [], []
        for _ in range(3):
            eng.flush_cache()
            before, t0 = totals(), time.perf_counter()
            eng.generate(input_ids=prompts, sampling_params=params)
            wall.append(time.perf_counter() - t0)
            d = {k: v - before[k] for k, v in totals().items()}
            steps = max(d["forward_steps"], 1.0)
            outside = d["step_seconds"] - d["forward_seconds"] - d["device_wait_seconds"]
            host.append(outside / steps * 1e3)
    return {"host_ms_per_step": statistics.median(host), "wall_s": statistics.median(wall)}


def run_worker(python: str, batch: int, overlap: bool, model_dir: str) -> dict[str, float]:
    """`measure` in a fresh interpreter: `python` imports its own checkout's radixgen."""
    cmd = [python, str(Path(__file__).resolve()), "--worker", "--batch", str(batch)]
    cmd += ["--model-dir", model_dir, *(["--overlap"] if overlap else [])]
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"{python}: the measurement failed\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def cpu_kind() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "amx_bf16" in flags:
        return "AMX + AVX-512 + AVX512-BF16"
    return "AVX-512 + AVX512-BF16" if "avx512_bf16" in flags else "AVX2 only"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="the baseline checkout (for the report)")
    ap.add_argument("--base-python", help="an interpreter with --base installed editable")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results", type=Path, help="append a section to this RESULTS.md")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--overlap", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.batch, args.overlap, args.model_dir)), flush=True)
        return 0

    sides = {"new": sys.executable}
    if args.base_python:
        sides = {"base": args.base_python, **sides}
    model_dir = str(Path(tempfile.gettempdir()) / "radixgen-bench-host-step-model")
    runs: dict[tuple[str, bool], list[float]] = {}
    for rnd in range(args.rounds):
        for overlap in (False, True):
            for side, python in sides.items():
                r = run_worker(python, args.batch, overlap, model_dir)
                runs.setdefault((side, overlap), []).append(r["host_ms_per_step"])
                print(json.dumps({"round": rnd, "side": side, "overlap": overlap, **r}), flush=True)
    summary: dict[str, Any] = {"batch": args.batch, "cpu": cpu_kind(), "rounds": args.rounds}
    for (side, overlap), values in runs.items():
        summary[f"{side}_{'overlap' if overlap else 'sync'}_host_ms"] = statistics.median(values)
    if "base" in sides:
        for mode in ("sync", "overlap"):
            summary[f"{mode}_ratio"] = (
                summary[f"new_{mode}_host_ms"] / summary[f"base_{mode}_host_ms"]
            )
    print(json.dumps(summary), flush=True)
    if args.results is not None:
        write_results(args.results, summary, args.base)
    return 0


def write_results(path: Path, s: dict[str, Any], base: Path | None) -> None:
    rows = []
    for mode in ("sync", "overlap"):
        ratio = f"{s[f'{mode}_ratio']:.2f}x" if f"{mode}_ratio" in s else "-"
        base_ms = f"{s[f'base_{mode}_host_ms']:.2f}" if f"base_{mode}_host_ms" in s else "-"
        rows.append(f"| {mode} | {base_ms} | {s[f'new_{mode}_host_ms']:.2f} | {ratio} |")
    body = "\n".join(
        [
            f"CPU: {s['cpu']}; tiny random model on CPU, {NEW_TOKENS} greedy tokens; the step's "
            f"time less the forward call, median of {s['rounds']} alternating rounds "
            f"(each the median of 3 batches). Baseline: {base or 'none'}.",
            "",
            "| scheduling | base host ms/step | new host ms/step | new / base |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    replace_section(
        path, f"Scheduler host work per decode step, batch {s['batch']} (bench_host_step.py)", body
    )


if __name__ == "__main__":
    sys.exit(main())
