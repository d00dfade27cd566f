"""Part (c) of bench_scale.py: tensor parallelism's decode step time and its communication share.

The default model (9 q / 3 KV heads) splits only in 3, so the comparison is --tp-size 3 against
--tp-size 1; `--shape tp2` runs --tp-size 2 against 1 on a random model of the default's size and
vocabulary with 12 q / 4 KV heads (head size 48), which splits in 2. Each server has its default
threads (the cores shared out among its ranks). A
batch of concurrent greedy requests (short prompts, `ignore_eos`) runs on each, alternating
between repeats; each server's own counters over the run give the mean step time and the share
of rank 0's step spent inside collectives (`tp_comm_seconds`: the step broadcast, the two sums
per layer, the embedding sum and the logits gather, waits for slower ranks included).

    python benchmark/bench_scale_tp.py [--quick] [--shape default|tp2] [--tp-sizes 1 3]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from server_launch import launch_server

COUNTERS = ("forward_steps", "step_seconds", "forward_seconds", "tp_comm_seconds",
            "generated_tokens")  # fmt: skip


# the default model's shape with heads that split in 2 (576 = 12 x 48)
TP2_HEADS = {"num_attention_heads": 12, "num_key_value_heads": 4}


def tp2_model_folder(root: Path) -> Path:
    """A random bf16 model of the default's size and vocabulary with `TP2_HEADS` (built once),
    with random_model.py's word-level tokenizer."""
    out = root / "radixgen-bench-tp2-shape"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from random_model import DEFAULT_SHAPE, write_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**{**DEFAULT_SHAPE, **TP2_HEADS}, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    write_tokenizer(out, DEFAULT_SHAPE["vocab_size"])
    return out


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def counters(url: str) -> dict[str, float]:
    state = httpx.get(url + "/server_info", timeout=30).json()["internal_states"][0]
    return {k: float(state.get(k, 0.0)) for k in COUNTERS}


def one_run(url: str, n: int, out_len: int) -> dict[str, Any]:
    """n requests at once; the server's step time and communication share over the run."""
    params = {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}
    bodies = [{"text": f"Request {i}: write about the number {i}.", "sampling_params": params}
              for i in range(n)]  # fmt: skip
    assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200
    before = counters(url)
    t0 = time.perf_counter()
    with httpx.Client(timeout=1800) as client, ThreadPoolExecutor(n) as pool:
        outs = list(pool.map(lambda b: client.post(url + "/generate", json=b), bodies))
    wall = time.perf_counter() - t0
    assert all(r.status_code == 200 for r in outs), [r.text for r in outs if r.status_code != 200]
    d = {k: v - before[k] for k, v in counters(url).items()}
    steps = max(1.0, d["forward_steps"])
    return {
        "wall_s": round(wall, 2),
        "out_tok_per_s": round(d["generated_tokens"] / wall, 1),
        "steps": int(d["forward_steps"]),
        "step_ms": round(1000 * d["step_seconds"] / steps, 2),
        "comm_ms_per_step": round(1000 * d["tp_comm_seconds"] / steps, 2),
        "comm_share": round(d["tp_comm_seconds"] / max(d["step_seconds"], 1e-9), 3),
    }


def part_c(
    tp_sizes: list[int], n: int, out_len: int, repeats: int, extra: list[str] | None = None
) -> dict[str, Any]:
    """Every tp size's runs and, for each size but the first, its step time over the first's."""
    flags = [["--tp-size", str(tp), *(extra or [])] for tp in tp_sizes]
    with ThreadPoolExecutor(len(flags)) as pool:  # they load at once, then run in turn
        servers: list[tuple[subprocess.Popen, str]] = list(pool.map(launch_server, flags))
    runs: dict[int, list[dict[str, Any]]] = {tp: [] for tp in tp_sizes}
    try:
        for _, url in servers:  # warm-up: first-step allocations, kernel selection
            one_run(url, 2, 4)
        for rep in range(repeats):
            order = list(zip(tp_sizes, servers, strict=True))
            for tp, (_, url) in order if rep % 2 == 0 else order[::-1]:
                rec = one_run(url, n, out_len)
                runs[tp].append(emit({"bench": "scale_tp", "tp_size": tp, "repeat": rep,
                                      "requests": n, "output_len": out_len, **rec}))  # fmt: skip
    finally:
        for proc, _ in servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    base = tp_sizes[0]
    summary: dict[str, Any] = {"bench": "scale_tp_ratio", "requests": n, "output_len": out_len,
                               "baseline_tp": base, "extra_flags": extra or []}  # fmt: skip
    for tp in tp_sizes:
        summary[f"tp{tp}_step_ms"] = statistics.median(r["step_ms"] for r in runs[tp])
        summary[f"tp{tp}_comm_share"] = statistics.median(r["comm_share"] for r in runs[tp])
        summary[f"tp{tp}_out_tok_per_s"] = statistics.median(r["out_tok_per_s"] for r in runs[tp])
    for tp in tp_sizes[1:]:
        ratios = [b["step_ms"] / a["step_ms"] for a, b in zip(runs[base], runs[tp], strict=True)]
        summary[f"tp{tp}_over_tp{base}_step_time"] = round(statistics.median(ratios), 3)
    return emit(summary)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument(
        "--shape",
        choices=("default", "tp2"),
        default="default",
        help="the default model (tp 1 vs 3), or its size with heads that split in 2",
    )
    ap.add_argument(
        "--tp-sizes",
        type=int,
        nargs="+",
        default=None,
        help="default: 1 3 (default shape), 1 2 (tp2 shape)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="runs per size (default 3, quick 1)")
    ap.add_argument("extra", nargs="*", help="more server flags (after --)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n, out_len = (4, 8) if args.quick else (8, 32)
    extra = list(args.extra)
    sizes = args.tp_sizes or ([1, 3] if args.shape == "default" else [1, 2])
    if args.shape == "tp2":
        extra += ["--model-path", str(tp2_model_folder(Path(tempfile.gettempdir())))]
    part_c(sizes, n, out_len, args.repeats or (1 if args.quick else 3), extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
