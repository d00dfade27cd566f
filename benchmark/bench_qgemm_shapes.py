"""The quantized GEMM against the bf16 GEMM on the default model's linear shapes, in one process.

SmolLM2-135M's layer shapes (qkv 960x576, o_proj 576x576, gate_up 3072x576, down 576x1536) as
Q4_1 (fmt u4) and its LM head (49152x576) as Q8_0 (fmt i8), at M = 1, 2, 8, 16, 64, 256 rows:
each shape timed back to back with `gemm_bf16` and with `qgemm` of every given build of
gemm_quant.c (the working tree's, and `--base REV`'s, compiled beside it), the minimum of
`--repeats` runs. Checks that every build's outputs are bitwise equal; prints, per M, the time ratio bf16 / quant per shape and for one decode step's
worth of them (30 layers plus the head): above 1 the quantized kernel is faster.

    python benchmark/bench_qgemm_shapes.py [--base HEAD] [--rows 1,2,8,16,64,256] [--repeats 15] [--threads N]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixgen.kernels.cpu import NativeKernels, build
from radixgen.kernels.cpu.isa import chosen_isa

SHAPES = (("qkv", 960, 576, "u4"), ("o", 576, 576, "u4"), ("gate_up", 3072, 576, "u4"),
          ("down", 576, 1536, "u4"), ("head", 49152, 576, "i8"))  # fmt: skip
LAYERS = 30


# the kernel variant this CPU runs best (or RADIXGEN_CPU_ISA's): every build here uses its flags
ISA = chosen_isa()[0] or "avx2"


def compile_variant(gemm_quant_source: str, out_dir: Path) -> NativeKernels:
    """All kernel sources with `gemm_quant_source` as gemm_quant.c, built into out_dir."""
    for name in (*build.SOURCES, *build.HEADERS):
        (out_dir / name).write_bytes((build.SOURCE_DIR / name).read_bytes())
    (out_dir / "gemm_quant.c").write_text(gemm_quant_source)
    compiler = build.find_compiler()
    out = out_dir / "kernels.so"
    cmd = [compiler.path, *build.variant_cflags(ISA), *(str(out_dir / s) for s in build.SOURCES)]
    subprocess.run([*cmd, "-o", str(out), *build.LDLIBS], check=True)
    import ctypes

    return NativeKernels(ctypes.CDLL(str(out)), ISA)


def random_quant(native: NativeKernels, n: int, k: int, fmt: str):
    """Random integers with small float16 scales (and mins): the kernel's speed ignores values."""
    g = torch.Generator().manual_seed(n * k)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3).half()
    if fmt == "u4":
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        return native.pack_quant(q, d, -8 * d, "u4")
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    return native.pack_quant(q, d, None, "i8")


def best_times(fns: dict[str, Callable[[], object]], repeats: int, budget_s: float = 0.01):
    """Per function, the minimum over `repeats` rounds of the mean of enough calls to fill
    budget_s; the rounds alternate the functions, so a noisy machine's drift hits all alike."""
    calls = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter()
        fn()
        calls[name] = max(1, int(budget_s / max(time.perf_counter() - start, 1e-6)))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls[name])
    return best


def cold_steps(libs: dict[str, NativeKernels], shapes, args) -> None:
    """Whole decode steps: every layer its own weights (bf16 ~212 MB, far beyond the caches),
    as the model reads them, so the bytes per weight count as they do end to end."""
    ref = next(iter(libs.values()))
    layers = []
    for layer in range(LAYERS):
        ws = {}
        for name, n, k, fmt in shapes:
            if name == "head" and layer:
                continue
            ws[name] = (ref.pack_linear(torch.randn(n, k).bfloat16()), random_quant(ref, n, k, fmt))
        layers.append(ws)
    ks = {s[0]: s[2] for s in shapes}
    print("M   step bf16 / quant per build (cold weights)")
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k).bfloat16() for k in ks.values()}

        def step(lib: NativeKernels | None, xs: dict[int, torch.Tensor] = xs) -> None:
            for ws in layers:
                for name, (pb, pq) in ws.items():
                    x = xs[ks[name]]
                    _ = ref.linear_bf16(x, pb) if lib is None else lib.linear_quant(x, pq)

        fns = {"bf16": lambda: step(None)} | {
            v: (lambda lib=lib: step(lib)) for v, lib in libs.items()
        }
        times = best_times(fns, max(3, args.repeats // 3), budget_s=0.0)
        cells = "  ".join(f"{v} {times['bf16'] / times[v]:.2f}" for v in libs)
        print(f"{m:<4}{cells}   (bf16 step {times['bf16'] * 1e3:.2f} ms)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="git revision for 'before' ('' for none)")
    ap.add_argument("--variant", action="append", default=[], help="extra gemm_quant.c files")
    ap.add_argument("--rows", default="1,2,8,16,64,256")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-check", action="store_true", help="skip the bitwise comparison")
    ap.add_argument("--threads", type=int, default=0, help="default: torch's")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--cold", action="store_true", help="whole steps over 30 layers' own weights")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench_qgemm_"))
    sources = {"new": (build.SOURCE_DIR / "gemm_quant.c").read_text()}
    if args.base:
        git = ["git", "show", f"{args.base}:kernels/cpu/gemm_quant.c"]
        sources = {"base": subprocess.check_output(git, cwd=build.SOURCE_DIR, text=True), **sources}
    for path in args.variant:
        sources[Path(path).stem] = Path(path).read_text()
    libs = {}
    for i, (name, src) in enumerate(sources.items()):
        (tmp / str(i)).mkdir()
        libs[name] = compile_variant(src, tmp / str(i))
    ref = next(iter(libs.values()))
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    packed = {}
    for name, n, k, fmt in shapes:
        w = torch.randn(n, k).bfloat16()
        packed[name] = (ref.pack_linear(w), ref_q := random_quant(ref, n, k, fmt))
        del ref_q
    if args.cold:
        cold_steps(libs, shapes, args)
        return
    print("M  " + " ".join(f"{s[0]:>9}" for s in shapes) + "     step   (bf16 / quant, per build)")
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, 1536).bfloat16()
        times: dict[str, dict[str, float]] = {"bf16": {}} | {v: {} for v in libs}
        for name, _n, k, _fmt in shapes:
            xb = x[:, :k].contiguous()
            pb, pq = packed[name]
            fns = {"bf16": lambda: ref.linear_bf16(xb, pb)}  # noqa: B023
            for v, lib in libs.items():
                fns[v] = lambda lib=lib: lib.linear_quant(xb, pq)  # noqa: B023
            outs = [lib.linear_quant(xb, pq, torch.float32) for lib in libs.values()]
            if not args.no_check and not all(
                torch.equal(outs[0], o) for o in outs
            ):  # the builds must agree bitwise
                raise SystemExit(f"M={m} {name}: the builds' outputs differ")
            for v, t in best_times(fns, args.repeats).items():
                times[v][name] = t
        step = {v: sum(t[s] * (1 if s == "head" else LAYERS) for s in t) for v, t in times.items()}
        for v in libs:
            cells = " ".join(f"{times['bf16'][s] / times[v][s]:9.2f}" for s, *_ in shapes)
            print(f"{m:<3}{cells}  {step['bf16'] / step[v]:7.2f}   {v}", flush=True)
        bf = " ".join(f"{times['bf16'][s] * 1e6:9.0f}" for s, *_ in shapes)
        print(f"{m:<3}{bf}  {step['bf16'] * 1e3:7.2f}ms bf16 us", flush=True)


if __name__ == "__main__":
    main()
