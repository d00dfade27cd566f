"""`bench_offline.py --device cuda`: the whole engine on a GPU against HF `generate` on the same
weights, in one run.

The model is the default model's shape with seeded random weights (random_model.py; the bundled
model does not travel to the GPU machine), driven with token ids. Measured through the real
engine (scheduler, radix cache, sampling), one JSON line per result:
- decode at batch 1, 8, 64, 256: 32-token prompts, 128 output tokens, ignore_eos, greedy; output
  tok/s over the whole run (prefill included, as the HF figures) and ms per decode step (the
  128-token run minus a 1-token run of the same prompts, over 127 steps); CUDA graphs on and off;
- 64 requests sharing a 1,500-token prefix (+ 32 own tokens, 32 output tokens) after one request
  primed it, radix cache on vs off;
- overlap scheduling on vs off at each batch size, with the scheduler's own accounting of a
  step: host work per step (the step's wall time less its wait for the device's tokens) and its
  share of the step;
- HF `generate` (dynamic cache, bf16) on the same prompts: the baseline.
`--dry-run` runs every step on CPU with a miniature model and tiny workloads (a check of the
script itself, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from random_model import DEFAULT_SHAPE, TINY_SHAPE, build_random_model, random_prompts

import radixgen

# H200 anchors for this shape (../shared/reference/gpu-path.md §8): output tok/s
LEAN_GRAPH_TOK_PER_S = {1: 394.0, 8: 2837.0, 64: 21748.0, 256: 72008.0}
TARGET_TOK_PER_S = {1: 400.0, 64: 22000.0, 256: 75000.0}


@dataclass(frozen=True)
class Plan:
    device: str
    tiny: bool
    batches: tuple[int, ...] = (1, 8, 64, 256)
    prompt_len: int = 32
    new_tokens: int = 128
    hf_new_tokens: int = 128
    prefix_requests: int = 64
    prefix_len: int = 1500
    suffix_len: int = 32
    prefix_new_tokens: int = 32

    @property
    def vocab_size(self) -> int:
        return int((TINY_SHAPE if self.tiny else DEFAULT_SHAPE)["vocab_size"])


def make_plan(quick: bool, dry_run: bool) -> Plan:
    """--quick keeps the issue's engine workloads and shortens HF's runs (~150 s on an H200)."""
    if dry_run:
        return Plan("cpu", True, (1, 4), 8, 6, 6, 4, 48, 4, 4)
    plan = Plan("cuda", False)
    return replace(plan, hf_new_tokens=32) if quick else plan


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --- RadixGen -----------------------------------------------------------------------------------


def engine_kwargs(
    plan: Plan, attention_backend: str, graphs: bool, radix: bool, overlap: bool = True
) -> dict[str, Any]:
    tokens_needed = plan.prefix_requests * (plan.prefix_len + plan.suffix_len + 64)
    tokens_needed += max(plan.batches) * (plan.prompt_len + plan.new_tokens + 8)
    return dict(
        device=plan.device,
        attention_backend=attention_backend if plan.device == "cuda" else "auto",
        dtype="bfloat16" if plan.device == "cuda" else "auto",
        grammar_backend="none",
        log_level="warning",
        max_running_requests=max(256, *plan.batches),
        max_total_tokens=tokens_needed,
        chunked_prefill_size=8192,
        max_prefill_tokens=16384,
        disable_cuda_graph=not graphs,
        disable_radix_cache=not radix,
        disable_overlap_schedule=not overlap,
    )


def flush_cache(engine: radixgen.Engine) -> None:
    """Empty the prefix cache (refused while the last requests are still being released)."""
    for _ in range(100):
        if engine.flush_cache()["success"]:
            return
        time.sleep(0.02)
    raise RuntimeError("the engine did not flush its prefix cache within 2 s")


def timed_generate(
    engine: radixgen.Engine, prompts: list[list[int]], new: int, flush: bool = True
) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds of one batch of greedy requests of exactly `new` output tokens each."""
    if flush:
        flush_cache(engine)
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    t = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    wall = time.perf_counter() - t
    assert isinstance(outs, list) and all(len(o["output_ids"]) == new for o in outs)
    return wall, outs


def scheduler_times(engine: radixgen.Engine) -> dict[str, float]:
    """The scheduler's step accounting so far (summed over replicas)."""
    states = engine.get_server_info()["internal_states"]
    keys = ("forward_steps", "step_seconds", "device_wait_seconds", "forward_seconds")
    return {k: float(sum(s.get(k, 0) for s in states)) for k in keys}


def engine_decode(engine: radixgen.Engine, plan: Plan, bs: int) -> dict[str, float]:
    prompts = random_prompts(bs, plan.prompt_len, plan.vocab_size, seed=1000 + bs)
    timed_generate(engine, prompts, 2)  # warm-up: this batch's prefill and decode shapes
    one, _ = timed_generate(engine, prompts, 1)
    before = scheduler_times(engine)
    wall, _ = timed_generate(engine, prompts, plan.new_tokens)
    after = scheduler_times(engine)
    d = {k: after[k] - before[k] for k in after}
    steps = max(d["forward_steps"], 1.0)
    host = d["step_seconds"] - d["device_wait_seconds"]
    step_s = max(wall - one, 1e-9) / (plan.new_tokens - 1)
    return {
        "tok_per_s": bs * plan.new_tokens / wall,
        "ms_per_step": step_s * 1e3,
        "decode_tok_per_s": bs / step_s,
        "prefill_s": one,
        "wall_s": wall,
        "scheduler_ms_per_step": d["step_seconds"] / steps * 1e3,
        "host_ms_per_step": host / steps * 1e3,
        "host_share": host / d["step_seconds"] if d["step_seconds"] else 0.0,
        # the model runner's forward call (on a GPU its launch): near the device's step time
        # when something in the launch path waits for the device (with overlap: the step before)
        "launch_ms_per_step": d["forward_seconds"] / steps * 1e3,
    }


def shared_prefix_prompts(plan: Plan) -> tuple[list[int], list[list[int]]]:
    """(a priming prompt, the requests): every prompt is the shared prefix + its own tokens."""
    prefix = random_prompts(1, plan.prefix_len, plan.vocab_size, seed=7)[0]
    own = random_prompts(plan.prefix_requests + 1, plan.suffix_len, plan.vocab_size, seed=8)
    return prefix + own[0], [prefix + s for s in own[1:]]


def engine_shared_prefix(engine: radixgen.Engine, plan: Plan) -> dict[str, float]:
    primer, prompts = shared_prefix_prompts(plan)
    warm = random_prompts(2, plan.prefix_len + plan.suffix_len, plan.vocab_size, seed=9)
    timed_generate(engine, warm, 2)  # warm-up: long prefill shapes
    timed_generate(engine, [primer], 1)  # the shared prefix enters the cache (if it is on)
    wall, outs = timed_generate(engine, prompts, plan.prefix_new_tokens, flush=False)
    return {
        "tok_per_s": len(prompts) * plan.prefix_new_tokens / wall,
        "wall_s": wall,
        "cached_tokens": float(sum(o["meta_info"].get("cached_tokens", 0) for o in outs)),
    }


def run_engine(
    folder: Path,
    plan: Plan,
    attention_backend: str,
    graphs: bool,
    radix: bool,
    work: str,
    overlap: bool = True,
) -> list[dict[str, Any]]:
    """One engine, the given workloads ("decode", "prefix"): one record each."""
    records = []
    kwargs = engine_kwargs(plan, attention_backend, graphs, radix, overlap)
    t = time.perf_counter()
    with radixgen.Engine(model_path=str(folder), **kwargs) as engine:
        start_s = time.perf_counter() - t
        common = {"engine": "radixgen", "cuda_graphs": graphs, "radix_cache": radix}
        common["overlap"] = overlap
        common["attention_backend"] = attention_backend
        if "decode" in work:
            for bs in plan.batches:
                rec = {"bench": "cuda_decode", **common, "batch": bs}
                rec |= {"prompt_tokens": plan.prompt_len, "new_tokens": plan.new_tokens}
                records.append(emit(rec | engine_decode(engine, plan, bs)))
        if "prefix" in work:
            rec = {"bench": "cuda_shared_prefix", **common, "requests": plan.prefix_requests}
            rec |= {"prefix_tokens": plan.prefix_len, "new_tokens": plan.prefix_new_tokens}
            records.append(emit(rec | engine_shared_prefix(engine, plan)))
    emit({"bench": "engine_start", **common, "start_s": start_s})
    return records


# --- HF transformers ----------------------------------------------------------------------------


def load_hf(folder: Path, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()


@torch.no_grad()
def hf_generate(model: Any, prompts: list[list[int]], new: int, device: str) -> float:
    """Wall seconds of HF `generate` (greedy, exactly `new` tokens) over one batch."""
    ids = torch.tensor(prompts, device=device)
    kw = {"do_sample": False, "pad_token_id": 0, "attention_mask": torch.ones_like(ids)}
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
    _sync(device)
    t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
    _sync(device)
    wall = time.perf_counter() - t
    assert out.shape == (len(prompts), ids.shape[1] + new)
    return wall


def run_hf(folder: Path, plan: Plan) -> list[dict[str, Any]]:
    model = load_hf(folder, plan.device)
    records = []
    for bs in plan.batches:
        prompts = random_prompts(bs, plan.prompt_len, plan.vocab_size, seed=1000 + bs)
        wall = hf_generate(model, prompts, plan.hf_new_tokens, plan.device)
        records.append(
            emit(
                {"bench": "cuda_decode", "engine": "hf_generate", "batch": bs,
                 "prompt_tokens": plan.prompt_len, "new_tokens": plan.hf_new_tokens,
                 "tok_per_s": bs * plan.hf_new_tokens / wall,
                 "ms_per_step": wall / plan.hf_new_tokens * 1e3, "wall_s": wall}
            )
        )  # fmt: skip
    _, prompts = shared_prefix_prompts(plan)
    wall = hf_generate(model, prompts, plan.prefix_new_tokens, plan.device)
    records.append(
        emit(
            {"bench": "cuda_shared_prefix", "engine": "hf_generate", "requests": len(prompts),
             "prefix_tokens": plan.prefix_len, "new_tokens": plan.prefix_new_tokens,
             "tok_per_s": len(prompts) * plan.prefix_new_tokens / wall, "wall_s": wall}
        )
    )  # fmt: skip
    del model
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return records


# --- the run ------------------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    def pick(bench: str, **match: Any) -> dict[str, Any] | None:
        for r in records:
            if r["bench"] == bench and all(r.get(k) == v for k, v in match.items()):
                return r
        return None

    summary: dict[str, Any] = {"bench": "cuda_summary"}
    for bs in plan.batches:
        on = pick("cuda_decode", engine="radixgen", batch=bs, cuda_graphs=True, overlap=True)
        off = pick("cuda_decode", engine="radixgen", batch=bs, cuda_graphs=False)
        no_overlap = pick("cuda_decode", engine="radixgen", batch=bs, overlap=False)
        hf = pick("cuda_decode", engine="hf_generate", batch=bs)
        row: dict[str, Any] = {}
        if on:
            row |= {"tok_per_s": on["tok_per_s"], "ms_per_step": on["ms_per_step"]}
            if bs in LEAN_GRAPH_TOK_PER_S:
                row["vs_lean_graph_loop"] = on["tok_per_s"] / LEAN_GRAPH_TOK_PER_S[bs]
            if bs in TARGET_TOK_PER_S:
                row["meets_target"] = on["tok_per_s"] >= TARGET_TOK_PER_S[bs]
        if on:
            row |= {"host_ms": on["host_ms_per_step"], "host_share": on["host_share"]}
        if off:
            row |= {"graphs_off_tok_per_s": off["tok_per_s"], "graphs_off_ms": off["ms_per_step"]}
        if no_overlap:
            row |= {
                "overlap_off_tok_per_s": no_overlap["tok_per_s"],
                "overlap_off_host_ms": no_overlap["host_ms_per_step"],
                "overlap_off_host_share": no_overlap["host_share"],
            }
        if on and hf:
            row |= {"hf_tok_per_s": hf["tok_per_s"], "vs_hf": on["tok_per_s"] / hf["tok_per_s"]}
        summary[f"batch{bs}"] = row
    cache_on = pick("cuda_shared_prefix", engine="radixgen", radix_cache=True)
    cache_off = pick("cuda_shared_prefix", engine="radixgen", radix_cache=False)
    hf_prefix = pick("cuda_shared_prefix", engine="hf_generate")
    if cache_on and cache_off:
        summary["shared_prefix_cache_speedup"] = cache_on["tok_per_s"] / cache_off["tok_per_s"]
    if cache_on and hf_prefix:
        summary["shared_prefix_vs_hf"] = cache_on["tok_per_s"] / hf_prefix["tok_per_s"]
    return summary


def run_cuda(args: argparse.Namespace) -> int:
    plan = make_plan(args.quick, args.dry_run)
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA device (--dry-run checks the script on CPU)")
    gpu = torch.cuda.get_device_name() if plan.device == "cuda" else "cpu (dry run)"
    emit({"bench": "machine", "device": gpu, "torch": torch.__version__,
          "cuda": torch.version.cuda, "plan": plan.__dict__})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        folder = build_random_model(args.model_dir or Path(tmp) / "model", tiny=plan.tiny)
        emit({"bench": "random_model", "folder": str(folder), "build_s": time.perf_counter() - t})
        records: list[dict[str, Any]] = []
        if not args.skip_hf:
            records += run_hf(folder, plan)
        backend = args.attention_backend
        records += run_engine(folder, plan, backend, graphs=True, radix=True, work="decode prefix")
        records += run_engine(folder, plan, backend, graphs=False, radix=True, work="decode")
        records += run_engine(
            folder, plan, backend, graphs=True, radix=True, work="decode", overlap=False
        )
        records += run_engine(folder, plan, backend, graphs=True, radix=False, work="prefix")
    summary = emit(summarize(records, plan))
    if args.results and not args.dry_run:
        write_results(args.results, gpu, records, summary, plan)
    return 0


def write_results(
    path: str, gpu: str, records: list[dict[str, Any]], summary: dict[str, Any], plan: Plan
) -> None:
    from benchmark_results import replace_section  # type: ignore[import-not-found]

    lines = [
        f"Machine: {gpu}, torch {torch.__version__} ({time.strftime('%Y-%m-%d')}); random bf16 "
        "weights of the default shape. Command: `python benchmark/bench_offline.py --device cuda"
        f"{' --quick' if plan.hf_new_tokens != plan.new_tokens else ''} --results ...`",
        "",
        "| batch | RadixGen tok/s | ms/step | host ms/step (share) | graphs off tok/s | ms/step | "
        "overlap off tok/s | host ms/step (share) | HF tok/s | vs HF | vs lean graph loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for bs in plan.batches:
        row = summary.get(f"batch{bs}", {})

        def f(key: str, fmt: str = ".1f", row: dict[str, Any] = row) -> str:
            return format(row[key], fmt) if key in row else "-"

        lines.append(
            f"| {bs} | {f('tok_per_s')} | {f('ms_per_step', '.2f')} | "
            f"{f('host_ms', '.2f')} ({f('host_share', '.0%')}) | "
            f"{f('graphs_off_tok_per_s')} | {f('graphs_off_ms', '.2f')} | "
            f"{f('overlap_off_tok_per_s')} | "
            f"{f('overlap_off_host_ms', '.2f')} ({f('overlap_off_host_share', '.0%')}) | "
            f"{f('hf_tok_per_s')} | {f('vs_hf', '.1f')}x | {f('vs_lean_graph_loop', '.2f')} |"
        )
    prefix = [r for r in records if r["bench"] == "cuda_shared_prefix"]
    lines += ["", "Shared 1,500-token prefix, 64 requests x 32 new tokens:"]
    for r in prefix:
        who = r["engine"] if r["engine"] != "radixgen" else f"radixgen, cache {r['radix_cache']}"
        lines.append(f"- {who}: {r['tok_per_s']:.1f} tok/s ({r['wall_s']:.2f} s)")
    replace_section(
        path, "Offline engine on CUDA (bench_offline.py --device cuda)", "\n".join(lines)
    )
