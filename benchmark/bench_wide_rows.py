"""Wide steps from bf16 copies against the quantized weights alone (RADIXGEN_AMX_WIDE_ROWS).

With RADIXGEN_AMX_WIDE_ROWS (opt-in), a model whose weights are kept quantized (the default
model's GGUF) also keeps a bf16 copy of its linear layers and head, which oneDNN multiplies (on
the tile unit where the CPU has AMX), for steps of at least that many rows; smaller steps keep
the quantized GEMM (fewer bytes to stream). This runs the default model (an in-process Engine
per mode, radix cache off) with the copies (`--rows`, default "auto"'s on AMX) and
without them (RADIXGEN_AMX_WIDE_ROWS=0, the default), alternating rounds, and measures greedy
decode throughput with 1 / 8 / 16 / 32 / 64 requests at once (output tokens / wall time, best
of `--repeats`) and the time to first token of one ~1,000-token prompt (a prefill of 1,000
rows); prints the ratios copies / none and, with --results, writes them to
benchmark/RESULTS.md. On a CPU without AMX the copies run on oneDNN's vector code.
`--unquant` runs the dequantized bf16 model instead: with the copies its small steps take the
native bf16 GEMM (and decoder stack), without them every step takes oneDNN on AMX CPUs.

    python benchmark/bench_wide_rows.py [--rounds 2] [--unquant] [--results benchmark/RESULTS.md]
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

from bench_host_step import cpu_kind
from benchmark_results import replace_section

BATCHES = (1, 8, 16, 32, 64)
PROMPT = "Write a story about a cat who learns to sail, chapter {i}."
LONG_PROMPT = " ".join(f"Fact {i}: the river near town {i} floods in spring." for i in range(90))


def measure(tokens: int, repeats: int, unquant: int) -> dict[str, float]:
    """This Engine's figures (the env is set by the parent): tok/s per batch, and the best
    TTFT (ms) of the long prompt."""
    import radixgen

    params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    out: dict[str, float] = {}
    model = {"quantization": "unquant"} if unquant else {}
    with radixgen.Engine(log_level="warning", disable_radix_cache=True, **model) as engine:
        engine.generate(["Hi", "Hello"], {**params, "max_new_tokens": 2})
        for batch in BATCHES:
            prompts = [PROMPT.format(i=i) for i in range(batch)]
            best = 0.0
            for _ in range(repeats):
                t = time.perf_counter()
                outs = engine.generate(prompts, params)
                made = sum(len(o["output_ids"]) for o in outs)
                best = max(best, made / (time.perf_counter() - t))
            out[f"batch{batch}"] = best
        ttft = []
        for _ in range(repeats + 1):  # one token: the prefill, then the first sample
            t = time.perf_counter()
            first = engine.generate(LONG_PROMPT, {**params, "max_new_tokens": 1})
            ttft.append(1000 * (time.perf_counter() - t))
        out["prefill_ttft_ms"] = min(ttft)
        out["prompt_tokens"] = first["meta_info"]["prompt_tokens"]
    return out


def run_worker(rows: str, tokens: int, repeats: int, unquant: bool) -> dict[str, float]:
    env = {**os.environ, "RADIXGEN_AMX_WIDE_ROWS": rows}
    worker = [str(tokens), str(repeats), str(int(unquant))]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *worker]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(
            f"the run with RADIXGEN_AMX_WIDE_ROWS={rows} failed\n{proc.stderr[-3000:]}"
        )
    figures: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=None, help="the copies' rows (default: AMX's)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="runs per Engine (best kept)")
    ap.add_argument("--results", type=Path, help="write a section into this RESULTS.md")
    ap.add_argument("--unquant", action="store_true", help="the dequantized bf16 model")
    ap.add_argument("--worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(*args.worker)), flush=True)
        return 0
    from radixgen.kernels.cpu.loader import AMX_WIDE_ROWS_DEFAULT, AMX_WIDE_ROWS_DENSE_DEFAULT

    rows = args.rows or (AMX_WIDE_ROWS_DENSE_DEFAULT if args.unquant else AMX_WIDE_ROWS_DEFAULT)
    modes = {"copies": str(rows), "none": "0"}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        for mode, value in modes.items():
            figures = run_worker(value, args.tokens, args.repeats, args.unquant)
            runs[mode].append(figures)
            print(json.dumps({"round": rnd, "mode": mode, **figures}), flush=True)
    keys = [f"batch{b}" for b in BATCHES] + ["prefill_ttft_ms"]
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in keys} for m in modes}
    ratio = {
        k: (med["copies"][k] / med["none"][k] if k.startswith("batch") else
            med["none"][k] / med["copies"][k])
        for k in keys
    }  # fmt: skip
    summary: dict[str, Any] = {
        "cpu": cpu_kind(), "cores": os.cpu_count(), "rows": rows, "medians": med, "ratio": ratio,
        "prompt_tokens": runs["none"][0]["prompt_tokens"],
    }  # fmt: skip
    print(json.dumps(summary), flush=True)
    if args.results is not None:
        write_results(args.results, summary, runs, args)
    return 0


def write_results(
    path: Path, s: dict[str, Any], runs: dict[str, list[dict[str, float]]], args: argparse.Namespace
) -> None:
    def cells(mode: str, key: str) -> str:
        return " / ".join(f"{r[key]:.0f}" for r in runs[mode])

    rows = [
        f"| {b} request(s) at once, output tok/s | {cells('copies', f'batch{b}')} | "
        f"{cells('none', f'batch{b}')} | **{s['ratio'][f'batch{b}']:.2f}x** |"
        for b in BATCHES
    ]
    rows.append(
        f"| time to first token, {s['prompt_tokens']}-token prompt (ms) | "
        f"{cells('copies', 'prefill_ttft_ms')} | {cells('none', 'prefill_ttft_ms')} | "
        f"**{s['ratio']['prefill_ttft_ms']:.2f}x** faster |"
    )
    model = (
        "the default model dequantized to bf16 (`--quantization unquant`)"
        if args.unquant
        else "the default model (Q4_1 kept quantized)"
    )
    baseline = (
        "no copies (on AMX: oneDNN for every step)" if args.unquant else "quantized weights only"
    )
    body = "\n".join(
        [
            f"CPU: {s['cpu']}, {s['cores']} cores; {model}, an "
            f"in-process Engine per mode, radix cache off, greedy, {args.tokens} tokens a "
            f"request, best of {args.repeats} runs per Engine, {args.rounds} alternating rounds "
            f"(cells: the rounds; ratios: of the medians). Copies serve steps of {s['rows']}+ "
            "rows. Command: `python benchmark/bench_wide_rows.py --rounds "
            f"{args.rounds} --repeats {args.repeats}{' --unquant' if args.unquant else ''}`.",
            "",
            f"| measure | bf16 copies for {s['rows']}+ rows | {baseline} "
            "(`RADIXGEN_AMX_WIDE_ROWS=0`) | copies / none |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    title = "Wide steps on AMX: bf16 copies of quantized weights (bench_wide_rows.py)"
    if args.unquant:
        title = "Wide steps on AMX: a bf16 model's oneDNN copies (bench_wide_rows.py --unquant)"
    replace_section(path, title, body)


if __name__ == "__main__":
    sys.exit(main())
