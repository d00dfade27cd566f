"""Weights kept quantized vs today's bf16 path on the default model, in one run.

For each of bf16 (`--quantization unquant`: the GGUF dequantized at load), Q4_1 kept quantized
(`gguf`) and int8 weight-only (`int8`): single-stream decode tok/s (the better of 1 and all
threads), throughput of 64 prompts x 128 output tokens, and the scheduler's RSS with
`--max-total-tokens 8192`; and Q4_1 once more without the native decoder stack
(`RADIXGEN_NATIVE_STACK=0`: each layer's kernels called from Python). Plus llama.cpp on the same GGUF when `llama-cpp-python` is installed
(optional, never a test dependency; it builds llama.cpp from source:
`CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36`). The machine's limit in
the same run: weight bytes read per token / read bandwidth.

    python benchmark/bench_quant.py [--quick] [--repeats N] [--skip-llama-cpp] [--rows bf16,q4_1]
                                    [--results benchmark/RESULTS.md]

Prints one JSON line per result, then a summary against the targets (Q4_1 single-stream >= 1.8x
bf16 and >= 1.3x llama.cpp's best thread setting, >= 60 % of the bytes-per-token limit; batched
not below bf16; scheduler RSS <= 50 % of bf16's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from bench_offline import (  # type: ignore[import-not-found]
    chat_prompts,
    emit,
    measure_limits,
    ours_batched,
    ours_single_stream,
)

import radixgen

# name, --quantization, --dtype, environment: `f32` is the dequantized float32 path (what CPUs
# without a quantized GEMM ran before their ISA variant had one); the last row is Q4_1 without
# the native decoder stack (runtime/models/native_stack.py), each layer's kernels called from
# Python as before it. RADIXGEN_CPU_ISA=avx2 (say) in the environment runs every row on that
# kernel variant.
CONFIGS: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("bf16", "unquant", "bfloat16", {}),
    ("f32", "unquant", "float32", {}),
    ("q4_1", "gguf", "bfloat16", {}),
    ("int8", "int8", "bfloat16", {}),
    ("q4_1_per_layer", "gguf", "bfloat16", {"RADIXGEN_NATIVE_STACK": "0"}),
)


# the scheduler gives its steps' transient memory back once its queue has been empty for a poll
# period (1 s; scheduler_process.IDLE_RELEASE_S): its RSS is read once that is done
IDLE_SETTLE_S = 1.5


def scheduler_rss_mb() -> float:
    """RSS of this process's scheduler child (the process holding the weights and KV pool),
    idle after the run."""
    time.sleep(IDLE_SETTLE_S)
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "child_main" in cmd and "scheduler" in cmd:
            return float(child.memory_info().rss / 2**20)
    raise RuntimeError("no scheduler process found")


def weight_bytes(folder: Path) -> dict[str, int]:
    """Weight bytes each configuration reads per decode step (the whole model once)."""
    bf16 = sum(f.stat().st_size for f in folder.glob("*.safetensors")) // 2  # float32 file
    from radixgen.runtime.model_loader.quant_loader import QUANT_CACHE

    packed = folder / QUANT_CACHE  # written by the first gguf load
    params = bf16 // 2
    return {
        "bf16": bf16,
        "f32": 2 * bf16,
        "q4_1": packed.stat().st_size if packed.exists() else 0,
        "int8": params * 34 // 32,  # int8 plus a float16 scale per 32
    }


def llama_cpp_single(gguf: Path, prompt: str, new: int, threads: int) -> float:
    from llama_cpp import Llama  # type: ignore[import-not-found,import-untyped]

    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, verbose=False, seed=0)
    llm(prompt, max_tokens=4, temperature=0)  # warm-up
    stamps = []
    for _ in llm(prompt, max_tokens=new, temperature=0, stream=True):
        stamps.append(time.perf_counter())
    del llm
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tokens (smoke run)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per figure (the best is kept)")
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--results", default=None, help="append a Markdown section to this file")
    names = [name for name, _, _, _ in CONFIGS]
    ap.add_argument(
        "--rows", default=",".join(names), help=f"comma-separated subset of {', '.join(names)}"
    )
    args = ap.parse_args()
    chosen = args.rows.split(",")
    if unknown := set(chosen) - set(names):
        ap.error(f"unknown rows {sorted(unknown)}")
    new_single = 32 if args.quick else 128
    new_batch = 16 if args.quick else 128
    n_prompts = 64
    cores = len(os.sched_getaffinity(0))
    from radixgen.runtime.model_loader import resolve_model_path
    from radixgen.runtime.model_loader.resolve import default_model_file
    from radixgen.runtime.text.tokenizer import Tokenizer

    folder = Path(resolve_model_path(None))
    tokenizer = Tokenizer(str(folder))
    prompts = chat_prompts(tokenizer, n_prompts)
    limits = emit({"bench": "machine", "cores": cores, **measure_limits(cores)})
    bandwidth = limits["read_gb_per_s"] * 1e9

    rows: dict[str, dict[str, float]] = {}
    for name, quantization, dtype, env in CONFIGS:
        if name not in chosen:
            continue
        row: dict[str, float] = {}
        os.environ.update(env)  # the scheduler child inherits it
        for threads in sorted({1, cores}):
            with radixgen.Engine(
                num_threads=threads, grammar_backend="none", log_level="warning",
                quantization=quantization, dtype=dtype, max_total_tokens=8192,
            ) as eng:  # fmt: skip
                if threads == cores:  # what ran (the variant a CPU picks, or RADIXGEN_CPU_ISA's)
                    emit({"bench": "config", "weights": name, "kernel_isa":
                          eng.get_server_info()["kernel_isa"]})  # fmt: skip
                # NOTE: the best of --repeats runs: these shared VMs vary by 10-30 % run to run
                for _ in range(args.repeats):
                    single = ours_single_stream(eng, prompts[0], new_single)
                    row["single"] = max(row.get("single", 0.0), single)
                if threads == cores:
                    row["batched"] = max(
                        ours_batched(eng, prompts, new_batch) for _ in range(args.repeats)
                    )
                    row["rss_mb"] = scheduler_rss_mb()
        for key in env:
            del os.environ[key]
        row["weight_bytes"] = weight_bytes(folder)[name.removesuffix("_per_layer")]
        if row["weight_bytes"]:
            row["share_of_bytes_limit"] = row["single"] * row["weight_bytes"] / bandwidth
        rows[name] = emit({"bench": "radixgen", "weights": name, **row})

    llama: dict[str, float] = {}
    if not args.skip_llama_cpp:
        try:
            import llama_cpp  # type: ignore[import-not-found,import-untyped]  # noqa: F401
        except ImportError:
            emit({"bench": "llama_cpp", "skipped": "llama-cpp-python is not installed"})
        else:
            raw = tokenizer.apply_chat_template(
                [{"role": "user", "content": "Write a short story about the sea (#0)."}]
            )
            for threads in sorted({1, cores}):
                llama[f"t{threads}"] = emit(
                    {"bench": "llama_cpp_single_stream", "threads": threads,
                     "tok_per_s": max(llama_cpp_single(default_model_file(), raw, new_single, threads)
                                      for _ in range(args.repeats))}
                )["tok_per_s"]  # fmt: skip

    summary: dict[str, Any] = {"bench": "summary"}
    # (summary key, row, metric, baseline row): each ratio whose two rows ran
    ratios = (
        ("q4_1_single_vs_bf16", "q4_1", "single", "bf16"),
        ("q4_1_single_vs_f32", "q4_1", "single", "f32"),
        ("q4_1_batched_vs_f32", "q4_1", "batched", "f32"),
        ("q4_1_batched_vs_bf16", "q4_1", "batched", "bf16"),
        ("q4_1_rss_vs_bf16", "q4_1", "rss_mb", "bf16"),
        ("int8_single_vs_bf16", "int8", "single", "bf16"),
        ("int8_rss_vs_bf16", "int8", "rss_mb", "bf16"),
        ("q4_1_stack_vs_per_layer_single", "q4_1", "single", "q4_1_per_layer"),
        ("q4_1_stack_vs_per_layer_batched", "q4_1", "batched", "q4_1_per_layer"),
    )
    for key, row_name, metric, base in ratios:
        if row_name in rows and base in rows:
            summary[key] = rows[row_name][metric] / rows[base][metric]
    if "q4_1" in rows:
        summary["q4_1_share_of_bytes_limit"] = rows["q4_1"].get("share_of_bytes_limit")
        if llama:
            summary["q4_1_single_vs_llama_cpp_best"] = rows["q4_1"]["single"] / max(llama.values())
    emit(summary)
    if args.results:
        write_results(args.results, rows, llama, limits, summary, " ".join(sys.argv))
    return 0


def cpu_kind() -> str:
    """The CPU's model name and the features the kernel variants turn on."""
    from radixgen.kernels.cpu import cpu_flags

    name = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), "unknown CPU",
    )  # fmt: skip
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "asimd")
    return f"{name} ({', '.join(f for f in wanted if f in cpu_flags())})"


def write_results(
    path: str,
    rows: dict[str, dict[str, float]],
    llama: dict[str, float],
    limits: dict[str, float],
    summary: dict[str, Any],
    command: str,
) -> None:
    lines = [
        "",
        "## Quantized weights, full run (bench_quant.py)",
        "",
        f"`python {command}` ({time.strftime('%Y-%m-%d')}; read bandwidth "
        f"{limits['read_gb_per_s']:.1f} GB/s; CPU {cpu_kind()}; kernel variant "
        f"{os.environ.get('RADIXGEN_CPU_ISA') or 'the best this CPU runs'})",
        "",
        "| weights | single-stream tok/s | share of bytes/token limit | 64x128 tok/s | "
        "scheduler RSS MB |",
        "|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        share = r.get("share_of_bytes_limit")
        lines.append(
            f"| {name} | {r['single']:.1f} | {'' if share is None else f'{share:.0%}'} | "
            f"{r['batched']:.1f} | {r['rss_mb']:.0f} |"
        )
    for key, v in llama.items():
        lines.append(f"| llama.cpp Q4_1 ({key}) | {v:.1f} | | | |")
    lines += ["", "Summary: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()
                                           if isinstance(v, float)), ""]  # fmt: skip
    with open(path, "a") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
