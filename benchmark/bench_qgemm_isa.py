"""The quantized GEMM of every ISA variant this CPU runs against torch's float32 F.linear on the
dequantized weight (what CPUs without a quantized GEMM ran), on the default model's shapes.

SmolLM2-135M's Q4_1 layers (u4: o 576x576, kv 192x576, qkv 960x576, gate_up 3072x576, down
576x1536) and its Q8_0 LM head (i8: 49152x576), at the given M: per shape and M the functions
alternate within each round and the best of `--repeats` rounds is kept (a noisy shared machine
drifts alike for all). `--cold` instead times whole decode steps (30 layers' own weights plus the
head: ~96 MB quantized, ~540 MB float32 streamed per step). `--torch-isa avx2` limits MKL and
oneDNN to AVX2 (what torch runs on an AVX2-only CPU); it must be set before torch loads.

    python benchmark/bench_qgemm_isa.py [--rows 1,32,64] [--repeats 7] [--threads 1] [--cold]
        [--torch-isa avx2] [--isas avx2,avx512,avx512bf16] [--act-quant int8,int8x2]

`--act-quant` adds each variant's int8-activation paths (RADIXGEN_CPU_ACT_QUANT's modes) as
`<variant>_<mode>`, interleaved with the rest, and prints the float-activation time over each.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import replace

SHAPES = (("o", 576, 576, "u4"), ("kv", 192, 576, "u4"), ("qkv", 960, 576, "u4"),
          ("gate_up", 3072, 576, "u4"), ("down", 576, 1536, "u4"),
          ("head", 49152, 576, "i8"))  # fmt: skip
LAYER = (("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536))


def random_quant(n: int, k: int, fmt: str, seed: int):
    """(q, d, m, float32 dequantized weight): random integers with small float16 scales."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3).half()
    if fmt == "u4":
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        m = -8 * d
    else:
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        m = None
    w = q.float().view(n, k // 32, 32) * d.float()[..., None]
    if m is not None:
        w = w + m.float()[..., None]
    return q, d, m, w.view(n, k)


def _step_quant(lib, shapes, weights, xs, act: str = "off") -> None:
    """One decode step's quantized linear layers (float32 out, as F.linear's)."""
    import torch

    for (_, k, _), w in zip(shapes, weights, strict=True):
        lib.linear_quant(xs[k], w, torch.float32, act_quant=act)


def best_of(fns: dict[str, Callable[[], object]], repeats: int, budget_s: float) -> dict:
    """Per function, the minimum over rounds of the mean time of the calls filling budget_s."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0, calls = time.perf_counter(), 0
            while True:
                fn()
                calls += 1
                dt = time.perf_counter() - t0
                if dt >= budget_s:
                    break
            best[name] = min(best[name], dt / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,32,64")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--torch-isa", default="", help="avx2: MKL and oneDNN limited to AVX2")
    ap.add_argument("--isas", default="", help="default: every variant this CPU runs")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--act-quant", default="", help="also these int8-activation modes")
    args = ap.parse_args()
    if args.torch_isa == "avx2":  # read when MKL / oneDNN initialise: before torch loads
        os.environ["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    import torch
    import torch.nn.functional as F

    from radixgen.kernels.cpu.isa import runnable_isas
    from radixgen.kernels.cpu.loader import load_kernels_for_isa

    torch.set_num_threads(args.threads)
    isas = args.isas.split(",") if args.isas else runnable_isas()
    libs = {isa: load_kernels_for_isa(isa) for isa in isas}
    libs = {isa: lib for isa, lib in libs.items() if lib.has_quant_gemm}
    torch_name = f"torch_f32{'_' + args.torch_isa if args.torch_isa else ''}"
    modes = [m for m in args.act_quant.split(",") if m]
    i8 = [(isa, m) for isa, lib in libs.items() if lib.act_int8_formats for m in modes]

    def i8_ratios(best: dict[str, float]) -> str:
        return "".join(f" {m} {best[isa] / best[f'{isa}_{m}']:.2f}x({isa})" for isa, m in i8)

    print(
        f"threads {args.threads}; variants {', '.join(libs)}; times in us (best of "
        f"{args.repeats}); ratios: {torch_name} time / variant time"
    )
    rows = [int(r) for r in args.rows.split(",")]
    if args.cold:
        shapes = [(n, k, "u4") for _ in range(30) for _, n, k in LAYER] + [(49152, 576, "i8")]
        # qkv and gate_up read RMSNorm outputs (act_quant "mixed")
        norm_fed = [name in ("qkv", "gate_up") for _ in range(30) for name, _, _ in LAYER] + [False]
        packed: dict[str, list] = {isa: [] for isa in libs}
        dense = []
        for i, (n, k, fmt) in enumerate(shapes):
            q, d, m, w = random_quant(n, k, fmt, i)
            for isa, lib in libs.items():
                packed[isa].append(replace(lib.pack_quant(q, d, m, fmt), reads_norm=norm_fed[i]))
            dense.append(w)
        for mrows in rows:
            xs = {k: torch.randn(mrows, k).bfloat16() for k in (576, 1536)}
            xf = {k: x.float() for k, x in xs.items()}
            fns: dict[str, Callable[[], object]] = {
                isa: (lambda lib=lib, ws=packed[isa], xs=xs: _step_quant(lib, shapes, ws, xs))
                for isa, lib in libs.items()
            }
            for isa, mode in i8:
                fns[f"{isa}_{mode}"] = lambda lib=libs[isa], ws=packed[isa], xs=xs, mode=mode: (
                    _step_quant(lib, shapes, ws, xs, mode)
                )
            fns[torch_name] = lambda xf=xf: [
                F.linear(xf[k], w) for (_, k, _), w in zip(shapes, dense, strict=True)
            ]
            best = best_of(fns, args.repeats, 0.0)
            cells = " ".join(f"{name}={t * 1e3:.2f}ms" for name, t in best.items())
            ratios = " ".join(f"{best[torch_name] / best[isa]:.2f}x({isa})" for isa in libs)
            print(f"cold step M={mrows}: {cells}  {ratios}{i8_ratios(best)}", flush=True)
        return
    for name, n, k, fmt in SHAPES:
        if name not in args.shapes.split(","):
            continue
        q, d, m, w = random_quant(n, k, fmt, n * k)
        packed1 = {isa: lib.pack_quant(q, d, m, fmt) for isa, lib in libs.items()}
        for mrows in rows:
            x = torch.randn(mrows, k).bfloat16()
            xf = x.float()
            fns = {
                isa: (lambda lib=lib, p=packed1[isa], x=x: lib.linear_quant(x, p, torch.float32))
                for isa, lib in libs.items()
            }
            for isa, mode in i8:
                fns[f"{isa}_{mode}"] = lambda lib=libs[isa], p=packed1[isa], x=x, mode=mode: (
                    lib.linear_quant(x, p, torch.float32, act_quant=mode)
                )
            fns[torch_name] = lambda xf=xf, w=w: F.linear(xf, w)
            best = best_of(fns, args.repeats, 0.02)
            cells = " ".join(f"{iname}={t * 1e6:.1f}" for iname, t in best.items())
            ratios = " ".join(f"{best[torch_name] / best[isa]:.2f}x({isa})" for isa in libs)
            print(f"{name} {n}x{k} {fmt} M={mrows}: {cells}  {ratios}{i8_ratios(best)}", flush=True)


if __name__ == "__main__":
    main()
