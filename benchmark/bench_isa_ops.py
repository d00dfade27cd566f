"""The fused ops, greedy scans and ragged attention of each native ISA variant at the default
model's decode and prefill shapes (SmolLM2-135M, bf16), timed back to back in one process.

    python benchmark/bench_isa_ops.py [--isa avx512 avx2] [--baseline REV] [--repeats 20]

--baseline REV adds REV's sources built for the last --isa variant (tagged "<isa>@REV"), so a
port can be compared with what it replaces. Prints the fastest sample of each kernel per
variant (microseconds per call, raw ctypes calls with bound arguments) and the ratios to the
first variant. Samples alternate between the variants; on a busy machine compare ratios."""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixgen.kernels.cpu import NativeKernels, build, load_kernels_for_isa

HIDDEN, H, HKV, D, INTER, VOCAB = 576, 9, 3, 64, 1536, 49152  # SmolLM2-135M
CTX = 500


def baseline_kernels(rev: str, isa: str, tmp: Path) -> NativeKernels:
    """`rev`'s kernel sources built for variant `isa` (same compiler and flags)."""
    root = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=True,
            cwd=build.SOURCE_DIR,
        ).stdout.strip()
    )
    for name in (*build.SOURCES, *build.HEADERS):
        src = subprocess.run(
            ["git", "show", f"{rev}:kernels/cpu/{name}"], capture_output=True, cwd=root
        )
        if src.returncode == 0:
            (tmp / name).write_bytes(src.stdout)
    compiler = build.find_compiler()
    out = tmp / f"baseline_{isa}.so"
    sources = [str(tmp / s) for s in build.SOURCES]
    cmd = [compiler.path, *build.variant_cflags(isa), *sources, "-o", str(out), *build.LDLIBS]
    subprocess.run(cmd, check=True)
    return NativeKernels(ctypes.CDLL(str(out)), isa)


def attention_case(nreq: int, rows: int, ctx: int, kv: torch.dtype, shared: int = 0):
    """Bound-argument call builder for `nreq` requests of `rows` query rows ending at `ctx`,
    whose first `shared` keys are the same pool slots (a prefix cached once)."""
    pool = nreq * ctx + 1
    if kv == torch.int8:
        k = torch.randint(-127, 128, (pool, HKV, D), dtype=torch.int8)
        v = torch.randint(-127, 128, (pool, HKV, D), dtype=torch.int8)
        ks, vs = torch.rand(pool, HKV) / 64, torch.rand(pool, HKV) / 64
    else:
        k = torch.randn(pool, HKV, D).to(kv)
        v = torch.randn(pool, HKV, D).to(kv)
        ks = vs = None
    slots = torch.randperm(pool - 1) + 1
    own = slots[shared:].view(-1)
    idx = torch.cat(
        [torch.cat([slots[:shared], own[r * (ctx - shared) : (r + 1) * (ctx - shared)]])
         for r in range(nreq)]
    ).contiguous()  # fmt: skip
    kv_indptr = torch.arange(nreq + 1) * ctx
    q_indptr = torch.arange(nreq + 1) * rows
    q_pos0 = torch.full((nreq,), ctx - rows, dtype=torch.long)
    q = torch.randn(nreq * rows, H, D).bfloat16()
    out = torch.empty_like(q)
    code = {torch.bfloat16: 1, torch.int8: 2, torch.float8_e4m3fn: 3}[kv]
    keep = (k, v, ks, vs, idx, kv_indptr, q_indptr, q_pos0, q, out)
    args = (
        q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), idx.data_ptr(),
        kv_indptr.data_ptr(), q_indptr.data_ptr(), q_pos0.data_ptr(), nreq, out.data_ptr(), H,
        HKV, D, D**-0.5, 1, 0, code, None if ks is None else ks.data_ptr(),
        None if vs is None else vs.data_ptr(),
    )  # fmt: skip
    return lambda nk: lambda: nk._ragged(*args), keep, out


def cases() -> list[tuple[str, Callable, object, torch.Tensor | None]]:
    """(name, nk -> zero-argument call, tensors kept alive, output to compare)."""
    out: list = []
    for n in (1, 8, 512):
        x = torch.randn(n, HIDDEN).bfloat16()
        res = torch.randn(n, HIDDEN)
        w = torch.randn(HIDDEN).bfloat16()
        o = torch.empty(n, HIDDEN, dtype=torch.bfloat16)
        a = (x.data_ptr(), res.data_ptr(), w.data_ptr(), o.data_ptr(), n, HIDDEN, 1e-5, 1, 1)
        out.append((f"add_rmsnorm N={n}", lambda nk, a=a: lambda: nk._add_rmsnorm(*a),
                    (x, res, w, o), None))  # fmt: skip
    for n in (1, 8, 512):
        gu = torch.randn(n, 2 * INTER).bfloat16()
        o = torch.empty(n, INTER, dtype=torch.bfloat16)
        a = (gu.data_ptr(), o.data_ptr(), n, INTER, 1, 1)
        out.append((f"silu_mul N={n}", lambda nk, a=a: lambda: nk._silu_mul(*a), (gu, o), o))
    for n in (1, 8, 512):
        qkv = torch.randn(n, (H + 2 * HKV) * D).bfloat16()
        pos = torch.arange(n, dtype=torch.long) + 100
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
        fr = torch.outer(torch.arange(2048).float(), inv)
        emb = torch.cat([fr, fr], -1)
        cos, sin = emb.cos().contiguous(), emb.sin().contiguous()
        kp = torch.zeros(4096, HKV, D, dtype=torch.bfloat16)
        vp = torch.zeros_like(kp)
        loc = torch.randperm(4096)[:n].contiguous()
        q = torch.empty(n, H, D, dtype=torch.bfloat16)
        a = (qkv.data_ptr(), qkv.stride(0), pos.data_ptr(), cos.data_ptr(), sin.data_ptr(),
             q.data_ptr(), kp.data_ptr(), vp.data_ptr(), loc.data_ptr(), n, H, HKV, D, 1, 1, 1,
             None, None)  # fmt: skip
        out.append((f"rope_store_kv N={n}", lambda nk, a=a: lambda: nk._rope(*a),
                    (qkv, pos, cos, sin, kp, vp, loc, q), q))  # fmt: skip
    for r in (1, 8):
        logits = torch.randn(r, VOCAB).bfloat16()
        hid = torch.randn(r, HIDDEN).bfloat16()
        wt = torch.randn(VOCAB, HIDDEN).bfloat16()
        rows = torch.arange(r, dtype=torch.long)
        ids = torch.empty(r, dtype=torch.long)
        a = (logits.data_ptr(), VOCAB, hid.data_ptr(), wt.data_ptr(), rows.data_ptr(), r, VOCAB,
             HIDDEN, None, 0, ids.data_ptr())  # fmt: skip
        out.append((f"greedy_refine_bf16 R={r}", lambda nk, a=a: lambda: nk._greedy(*a),
                    (logits, hid, wt, rows, ids), ids))  # fmt: skip
        lf = torch.randn(r, VOCAB)
        ids2 = torch.empty(r, dtype=torch.long)
        a2 = (lf.data_ptr(), VOCAB, None, r, VOCAB, None, 0, ids2.data_ptr())
        out.append((f"argmax_f32 R={r}", lambda nk, a=a2: lambda: nk._argmax(*a),
                    (lf, ids2), ids2))  # fmt: skip
    for kv, tag in ((torch.bfloat16, "bf16"), (torch.int8, "int8"), (torch.float8_e4m3fn, "fp8")):
        for name, nreq, rows, ctx, shared in (
            ("decode N=1", 1, 1, CTX, 0),
            ("decode N=8", 8, 1, CTX, 0),
            ("prefill 512", 1, 512, 512, 0),
            # 16 decode rows on one cached 1,500-token prefix (a few-shot block, a document)
            ("decode N=16 shared 1500", 16, 1, 1540, 1500),
        ):
            mk, keep, o = attention_case(nreq, rows, ctx, kv, shared)
            out.append((f"attention {tag} {name} ctx {ctx}", mk, keep, o))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--isa", nargs="+", default=["avx512", "avx2"])
    ap.add_argument("--baseline", default=None, help="git revision for the last --isa variant")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--only", default="", help="substring of the case names to run")
    args = ap.parse_args()
    torch.manual_seed(0)
    kernels = {isa: load_kernels_for_isa(isa) for isa in args.isa}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            kernels[f"{args.isa[-1]}@{args.baseline}"] = baseline_kernels(
                args.baseline, args.isa[-1], Path(tmp)
            )
        tags = list(kernels)
        print(f"threads {torch.get_num_threads()}; us per call (best of {args.repeats})")
        print(f"{'case':44s}" + "".join(f"{t:>16s}" for t in tags) + "   ratios to " + tags[0])
        for name, mk, _keep, _out in cases():
            if args.only not in name:
                continue
            calls = {t: mk(nk) for t, nk in kernels.items()}
            for fn in calls.values():  # warm up, and time one call for the inner count
                fn()
            t0 = time.perf_counter()
            calls[tags[0]]()
            inner = max(1, int(3e-3 / max(time.perf_counter() - t0, 1e-7)))
            times: dict[str, list[float]] = {t: [] for t in tags}
            for i in range(args.repeats):
                order = tags if i % 2 == 0 else tags[::-1]
                for t in order:
                    fn = calls[t]
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        fn()
                    times[t].append((time.perf_counter() - t0) / inner)
            best = {t: min(v) * 1e6 for t, v in times.items()}
            ratios = " ".join(f"{best[t] / best[tags[0]]:5.2f}" for t in tags[1:])
            print(f"{name:44s}" + "".join(f"{best[t]:16.1f}" for t in tags) + "   " + ratios)


if __name__ == "__main__":
    main()
