"""Multi-LoRA decode throughput (issue 35, item 6): 64 requests spread over 1, 4 and 16 adapters,
against the base model alone and against the merged weights of one adapter.

The model is the default model's shape with seeded random bf16 weights (random_model.py); the
adapters are random PEFT LoRAs (rank 16 on q/k/v/o/gate/up/down, nonzero B) written by peft, and
the merged model is peft's `merge_and_unload` of adapter 0. Each configuration runs in a fresh
offline `Engine`: a warm-up batch, then the timed batch of 64 prompts (ids) x `--output-len`
tokens (ignore_eos); throughput is output tokens / wall seconds of that batch. The scheduler
process's CPU seconds over the batch are reported beside it (`sched_cpu_s`, and a CPU-time ratio
in the summary): on a shared 2-core machine other processes move the wall-clock figure, far less
the CPU time the scheduler itself spent.

    python benchmark/bench_lora.py [--work-dir /tmp/bench_lora] [--output-len 64] [--rank 16]

Prints one JSON line per configuration and a summary of ratios to the base model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch

import radixgen

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_model import build_random_model, random_prompts

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapters(base_dir: Path, work: Path, n: int, rank: int) -> tuple[list[Path], Path]:
    """n random adapters of `rank` and the merged model of adapter 0 (both reused when present)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = [work / f"adapter{i}" for i in range(n)]
    merged = work / "merged"
    if (
        all((p / "adapter_config.json").exists() for p in paths)
        and (merged / "config.json").exists()
    ):
        return paths, merged
    for i, path in enumerate(paths):
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, lora_dropout=0.0)
        peft_model = get_peft_model(model, cfg)
        gen = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        peft_model.save_pretrained(str(path))
        if i == 0:
            out = peft_model.merge_and_unload()
            out.to(torch.bfloat16).save_pretrained(str(merged), safe_serialization=True)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(base_dir / name, merged / name)
    return paths, merged


def scheduler_process() -> psutil.Process:
    """The offline Engine's scheduler child (its command line names the role)."""
    for child in psutil.Process().children(recursive=True):
        if "scheduler" in " ".join(child.cmdline()):
            return child
    raise RuntimeError("no scheduler process under this one")


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def run(
    label: str,
    folder: Path,
    prompts: list[list[int]],
    loras: list[str | None] | None,
    output_len: int,
    **engine_args: Any,
) -> dict[str, Any]:
    params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
    with radixgen.Engine(
        str(folder),
        dtype="bfloat16",
        grammar_backend="none",
        log_level="warning",
        disable_radix_cache=True,
        **engine_args,
    ) as engine:
        warm = [p[:8] for p in prompts[:8]]
        engine.generate(
            input_ids=warm,
            sampling_params={**params, "max_new_tokens": 4},
            lora_path=None if loras is None else loras[:8],
        )
        sched = scheduler_process()
        cpu0, t0 = cpu_seconds(sched), time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params, lora_path=loras)
        seconds = time.perf_counter() - t0
        sched_cpu = cpu_seconds(sched) - cpu0
    assert isinstance(outs, list)
    tokens = sum(len(o["output_ids"]) for o in outs)
    record = {"config": label, "output_tokens": tokens, "seconds": round(seconds, 2)}
    record["tok_per_s"] = round(tokens / seconds, 1)
    record["sched_cpu_s"] = round(sched_cpu, 2)
    record["tok_per_cpu_s"] = round(tokens / sched_cpu, 1)
    print(json.dumps(record), flush=True)
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", default="/tmp/bench_lora")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["base", "merged", "lora-base", "1", "4", "16"],
        help="which configurations to run (a number: requests spread over that many adapters)",
    )
    args = ap.parse_args()
    work = Path(args.work_dir)
    base_dir = build_random_model(work / "base")
    paths, merged = build_adapters(base_dir, work, 16, args.rank)
    n = args.requests
    prompts = random_prompts(n, args.input_len, 49152, seed=1)
    lora_paths = [f"a{i}={p}" for i, p in enumerate(paths)]
    results = []
    if "base" in args.configs:
        results.append(run("base", base_dir, prompts, None, args.output_len))
    if "merged" in args.configs:
        results.append(run("merged (adapter 0)", merged, prompts, None, args.output_len))
    if "lora-base" in args.configs:
        results.append(run("lora on, base requests", base_dir, prompts, None, args.output_len,
                           lora_paths=lora_paths[:1]))  # fmt: skip
    for k in (int(c) for c in args.configs if c.isdigit()):
        loras: list[str | None] = [f"a{i % k}" for i in range(n)]
        results.append(
            run(f"{k} adapter(s)", base_dir, prompts, loras, args.output_len,
                lora_paths=lora_paths[:k], max_loras_per_batch=k)
        )  # fmt: skip
    if results[0]["config"] != "base":
        return 0  # no base run to compare with
    base = results[0]["tok_per_s"]
    summary = {r["config"]: round(r["tok_per_s"] / base, 3) for r in results}
    base_cpu = results[0]["tok_per_cpu_s"]
    cpu = {r["config"]: round(r["tok_per_cpu_s"] / base_cpu, 3) for r in results}
    print(json.dumps({"ratio_to_base": summary, "cpu_time_ratio_to_base": cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
