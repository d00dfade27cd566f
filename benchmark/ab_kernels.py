"""Two builds of the native CPU kernels inside one real decode, alternated call by call or in
blocks of steps.

The default model decodes one request at a time in this process (an in-process scheduler, no
server), and every call of the native decoder stack and of the LM head goes to the builds in
turn: `--base REV`'s kernel sources (git) and the working tree's. On these noisy VMs two runs of
the same build differ by 10-30 %; calls interleaved within one run see the same machine, so
their ratio is what a kernel change is worth end to end, weights streamed from memory as in
serving (which `bench_qgemm_shapes.py`'s warm shapes do not show). Prints per build and round
the minimum and median stack and head times, then the base/new ratios of the medians; then
decodes once with each build alone and says whether their tokens are identical (the kernels are
deterministic, so a change to the arithmetic shows as a difference here, or as none at all).

`--block N` alternates the builds every N whole scheduler steps instead, and also times the
steps: a change that alters what the kernels leave in the caches (e.g. non-temporal weight
loads) moves the rest of the step too (Python, sampling, small torch ops), which call-by-call
turns hide. The first step of each block is not counted (the caches are the other build's).

    python benchmark/ab_kernels.py [--base HEAD] [--quantization gguf] [--tokens 256]
                                   [--rounds 4] [--block N]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from radixgen.io_struct import TokenizedGenerateReq
from radixgen.kernels.cpu import NativeKernels, build
from radixgen.kernels.cpu.isa import chosen_isa
from radixgen.runtime.model_loader import resolve_model_path
from radixgen.runtime.models import causal_lm, native_stack
from radixgen.runtime.scheduler.scheduler_process import build_scheduler
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import ServerArgs

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a long story about a dragon who learns to code."


# the kernel variant this CPU runs best (or RADIXGEN_CPU_ISA's): every build here uses its flags
ISA = chosen_isa()[0] or "avx2"


def compile_build(rev: str | None, out_dir: Path) -> NativeKernels:
    """The kernel library from git revision `rev`'s sources (None: the working tree's)."""
    for name in (*build.SOURCES, *build.HEADERS):
        if rev is None:
            data = (build.SOURCE_DIR / name).read_bytes()
        else:
            rel = (build.SOURCE_DIR / name).resolve().relative_to(ROOT)
            shown = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True)
            if shown.returncode != 0:  # a header the revision does not have (nor include)
                continue
            data = shown.stdout
        (out_dir / name).write_bytes(data)
    compiler = build.find_compiler()
    out = out_dir / "kernels.so"
    cmd = [compiler.path, *build.variant_cflags(ISA), *(str(out_dir / s) for s in build.SOURCES)]
    subprocess.run([*cmd, "-o", str(out), *build.LDLIBS], check=True)
    return NativeKernels(ctypes.CDLL(str(out)), ISA)


def alternate(
    builds: dict[str, NativeKernels],
    times: dict[str, dict[str, list[float]]],
    block: Callable[[], str | None],
) -> list[str]:
    """Route the decoder stack's and the LM head's calls to the builds in turn, timing each;
    to `block()`'s build when it names one (the block mode). Returns the list of builds taking
    turns (change it in place to run one build alone)."""
    names = list(builds)
    turn = {"stack": 0, "head": 0}

    def routed(
        part: str, fn: Callable[..., Any], set_kernels: Callable[[Any, NativeKernels], None]
    ):
        def call(self: Any, *args: Any) -> Any:
            name = block() or names[turn[part] % len(names)]
            turn[part] += 1
            set_kernels(self, builds[name])
            start = time.perf_counter()
            out = fn(self, *args)
            times[part][name].append(time.perf_counter() - start)
            return out

        return call

    stack_cls, model_cls = native_stack.NativeDecoderStack, causal_lm.CausalLM
    stack_cls.forward = routed(  # type: ignore[method-assign]
        "stack", stack_cls.forward, lambda s, k: setattr(s, "kernels", k)
    )
    model_cls.compute_logits = routed(  # type: ignore[method-assign]
        "head", model_cls.compute_logits, lambda m, k: setattr(m.vocab, "gemm", k)
    )
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="git revision of the 'base' build")
    ap.add_argument("--quantization", default="gguf", help="gguf (Q4_1 kept), int8, unquant")
    ap.add_argument("--tokens", type=int, default=256, help="greedy tokens per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--block", type=int, default=0, help="alternate every N scheduler steps (0: every call)"
    )
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for name, rev in (("base", args.base), ("new", None)):
            (Path(tmp) / name).mkdir()
            builds[name] = compile_build(rev, Path(tmp) / name)
        times: dict[str, dict[str, list[float]]] = {
            "stack": defaultdict(list),
            "head": defaultdict(list),
        }
        if args.block:
            times["step"] = defaultdict(list)
        current: list[str | None] = [None]  # the block mode's build for this step
        server_args = ServerArgs.from_kwargs(max_total_tokens=8192, quantization=args.quantization)
        scheduler = build_scheduler(server_args, resolve_model_path(None))
        ids = scheduler.tokenizer.encode(PROMPT, add_special_tokens=False)
        turns = alternate(builds, times, lambda: current[0])
        names = list(builds)

        def decode(rid: str, tokens: int) -> list[int]:
            params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
            scheduler.add_request(
                TokenizedGenerateReq(
                    rid, ids, SamplingParams.from_dict(params), stream=False,
                    arrival_time=time.time(),
                )
            )  # fmt: skip
            out: list[int] = []
            step = 0
            while scheduler.has_work:
                if args.block and len(turns) > 1:
                    current[0] = names[(step // args.block) % len(names)]
                start = time.perf_counter()
                sent = scheduler.step()
                if args.block and len(turns) > 1 and step % args.block:
                    times["step"][current[0] or ""].append(time.perf_counter() - start)
                step += 1
                for batch in sent:
                    for d in batch.deltas:
                        if d.rid == rid:
                            out.extend(d.new_token_ids)
            current[0] = None
            return out

        decode("warm-up", 8)
        if not times["stack"]:
            raise SystemExit("this model runs without the native decoder stack here")
        outputs = []
        ratios: dict[str, list[float]] = defaultdict(list)
        for rnd in range(args.rounds):
            for part in times.values():
                part.clear()
            outputs.append(decode(f"round-{rnd}", args.tokens))
            for part, per_build in times.items():
                if args.block:  # the block's first step is not counted: drop its calls too
                    if part != "step":
                        for b, t in per_build.items():
                            per_build[b] = [x for i, x in enumerate(t) if i % args.block]
                # the first calls of a round run the prefill (and its first decode steps)
                med = {b: statistics.median(t[4:]) * 1e3 for b, t in per_build.items()}
                low = {b: min(t[4:]) * 1e3 for b, t in per_build.items()}
                ratios[part].append(med["base"] / med["new"])
                cells = "  ".join(f"{b} min {low[b]:.3f} med {med[b]:.3f} ms" for b in med)
                print(f"round {rnd} {part:5s} {cells}  base/new {ratios[part][-1]:.3f}", flush=True)
        for part, rs in ratios.items():
            rounded = ", ".join(f"{r:.3f}" for r in rs)
            print(f"{part}: base/new median time {statistics.median(rs):.3f} (rounds {rounded})")
        alone = {}
        for name in builds:
            turns[:] = [name]
            alone[name] = decode(f"{name}-alone", args.tokens)
        same = alone["base"] == alone["new"] == outputs[0]
        print(f"tokens identical with each build alone and alternating: {same}")


if __name__ == "__main__":
    main()
