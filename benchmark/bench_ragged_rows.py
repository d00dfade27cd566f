"""Ragged attention with several query rows per request (speculative verify, prefill chunks):
this tree's kernel against a baseline revision's, timed back to back in one process.

    python benchmark/bench_ragged_rows.py [--baseline HEAD~1] [--repeats 30]

Prints, per case, the fastest sample of each kernel and new / baseline, and checks that both give
bitwise the same output (the kernels' exactness invariant)."""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from radixgen.kernels.cpu import NativeKernels, build, load_native_kernels
from radixgen.kernels.cpu.isa import chosen_isa

# (name, requests, rows per request, context length of each request's last row)
CASES = [
    ("1 req x 9 rows, ctx 1500", 1, 9, 1500),
    ("8 req x 9 rows, ctx 1500", 8, 9, 1500),
    ("1 req x 1 row (decode), ctx 1500", 1, 1, 1500),
    ("8 req x 1 row (decode), ctx 1500", 8, 1, 1500),
    ("1 req x 512-row prefill chunk, ctx 1536", 1, 512, 1536),
]
H, HKV, D = 9, 3, 64  # SmolLM2-135M


# the kernel variant this CPU runs best (or RADIXGEN_CPU_ISA's): every build here uses its flags
ISA = chosen_isa()[0] or "avx2"


def baseline_kernels(rev: str, tmp: Path) -> NativeKernels:
    """The library built from `rev`'s kernel sources (same flags and compiler as this tree)."""
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
    out = tmp / "baseline.so"
    flags = [*build.variant_cflags(ISA)]
    sources = [str(tmp / s) for s in build.SOURCES]
    subprocess.run([compiler.path, *flags, *sources, "-o", str(out), *build.LDLIBS], check=True)
    return NativeKernels(ctypes.CDLL(str(out)), ISA)


def make_case(nreq: int, rows: int, ctx: int, dtype: torch.dtype = torch.bfloat16):
    pool = nreq * ctx + 1
    k = torch.randn(pool, HKV, D).to(dtype)
    v = torch.randn(pool, HKV, D).to(dtype)
    perm = torch.randperm(pool - 1) + 1
    kv_indptr = torch.arange(nreq + 1) * ctx
    q_indptr = torch.arange(nreq + 1) * rows
    q_pos0 = torch.full((nreq,), ctx - rows, dtype=torch.long)
    q = torch.randn(nreq * rows, H, D).to(dtype)
    return q, k, v, perm[: nreq * ctx].contiguous(), kv_indptr, q_indptr, q_pos0


def run(nk: NativeKernels, case, out: torch.Tensor) -> None:
    q, k, v, idx, kv_indptr, q_indptr, q_pos0 = case
    nk.ragged_attention(q, k, v, idx, kv_indptr, q_indptr, q_pos0, out, D**-0.5)


def raw_call(nk: NativeKernels, case, out: torch.Tensor, layers: list | None = None):
    """The C function with its arguments bound (timing without the binding's checks); with
    `layers` ([(k, v)]), each call reads the next layer's pool, as a forward does (the pools
    then come from memory, not from the cache the previous call filled)."""
    q, k, v, idx, kv_indptr, q_indptr, q_pos0 = case
    pools = layers or [(k, v)]
    args = [
        (
            q.data_ptr(),
            q.stride(0),
            lk.data_ptr(),
            lv.data_ptr(),
            idx.data_ptr(),
            kv_indptr.data_ptr(),
            q_indptr.data_ptr(),
            q_pos0.data_ptr(),
            q_indptr.numel() - 1,
            out.data_ptr(),
            H,
            HKV,
            D,
            D**-0.5,
            1,
            0,
            1,
            None,
            None,
        )
        for lk, lv in pools
    ]
    fn = nk._ragged
    state = {"i": 0}

    def call() -> None:
        state["i"] = (state["i"] + 1) % len(args)
        fn(*args[state["i"]])

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline", default="HEAD", help="git revision of the baseline kernel")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument(
        "--layers", type=int, default=1, help="pools read in turn (32: beyond the L3 cache)"
    )
    ap.add_argument(
        "--cpu-clock",
        action="store_true",
        help="time by this thread's CPU time (robust on a busy machine; one OpenMP thread only)",
    )
    args = ap.parse_args()
    clock = time.thread_time if args.cpu_clock else time.perf_counter
    torch.manual_seed(0)
    new = load_native_kernels()
    assert new is not None
    with tempfile.TemporaryDirectory() as tmp:
        old = baseline_kernels(args.baseline, Path(tmp))
        print(f"threads {torch.get_num_threads()}, H={H} Hkv={HKV} D={D} bf16")
        for name, nreq, rows, ctx in CASES:
            case = make_case(nreq, rows, ctx)
            outs = {"old": torch.empty_like(case[0]), "new": torch.empty_like(case[0])}
            layers = [
                (torch.randn_like(case[1], dtype=torch.float32).bfloat16(),
                 torch.randn_like(case[2], dtype=torch.float32).bfloat16())
                for _ in range(args.layers - 1)
            ] + [(case[1], case[2])]  # fmt: skip
            calls = {
                tag: raw_call(nk, case, outs[tag], layers)
                for tag, nk in (("old", old), ("new", new))
            }
            times: dict[str, list[float]] = {"old": [], "new": []}
            inner = max(1, int(2e-3 / (0.02e-3 * nreq * rows)))  # ~ms per sample
            for i in range(args.repeats + 3):
                for tag in ("old", "new") if i % 2 else ("new", "old"):
                    fn = calls[tag]
                    t0 = clock()
                    for _ in range(inner):
                        fn()
                    if i >= 3:
                        times[tag].append((clock() - t0) / inner)
            same = torch.equal(outs["old"].view(torch.int16), outs["new"].view(torch.int16))
            mo, mn = min(times["old"]), min(times["new"])  # the least disturbed sample
            print(
                f"{name:42s} old {mo * 1e3:8.3f} ms  new {mn * 1e3:8.3f} ms  "
                f"new/old {mn / mo:5.2f}  bitwise-equal {same}"
            )


if __name__ == "__main__":
    main()
