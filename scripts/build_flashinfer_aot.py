"""Build flashinfer's attention modules ahead of time on a CPU machine, for the GPU machine.

flashinfer-python ships CUDA sources only: each (kernel, dtype, head_dim, ...) module is compiled
with nvcc on first use. The lent GPU machine has no time for that, so the modules RadixGen's
flashinfer backend (kernels/attention/flashinfer_backend.py) plans are compiled here (nvcc 13,
sm_90a, a stub libcuda) and copied to `<out>/<name>/<name>.so`; on the GPU machine they go into
`flashinfer/data/aot/`, where flashinfer loads them without compiling (`FLASHINFER_DISABLE_JIT=1`
proves the set complete). Run by scripts/prepare_gpu_carry.sh; `--check` (scripts/gpu_check.sh,
and the prepare script on CPU) says whether the installed flashinfer finds every module prebuilt.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def specs(head_dims: list[int]) -> list[Any]:
    """The JIT specs of every module the backend plans: the arguments are those its wrappers'
    `plan()` and `merge_state_in_place` pass for bf16 q/kv/out, int32 indices, no rotary inside
    the kernel, no sliding window, no logits soft cap."""
    import torch
    from flashinfer.jit.attention.modules import gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.cascade import gen_cascade_module

    bf16, i32 = torch.bfloat16, torch.int32
    found = [gen_cascade_module()]  # merge_state_in_place
    for d in head_dims:
        # ragged + paged prefill (FA2: sm_90's default FA3 would compile on the device)
        found.append(
            gen_batch_prefill_module("fa2", bf16, bf16, bf16, i32, d, d, 0, False, False, False)
        )
        # paged decode on CUDA cores (the default model's GQA group of 3 is below tensor-core use)
        found.append(gen_batch_decode_module(bf16, bf16, bf16, i32, d, d, 0, False, False))
    return found


def build(out: Path, head_dims: list[int]) -> None:
    for spec in specs(head_dims):
        t0 = time.perf_counter()
        spec.build(verbose=False)
        target = out / spec.name / f"{spec.name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, target)
        size = target.stat().st_size / 1024
        print(f"{spec.name}: {time.perf_counter() - t0:.1f} s, {size:.0f} KiB", flush=True)


def check(head_dims: list[int], load: bool) -> bool:
    """Whether every module is where flashinfer looks for prebuilt ones (and, with `load`, loads:
    that needs the CUDA runtime, i.e. the GPU machine)."""
    import flashinfer

    ok = True
    print(f"flashinfer {flashinfer.__version__} from {Path(flashinfer.__file__).parent}")
    for spec in specs(head_dims):
        state = "prebuilt" if spec.is_aot else "MISSING"
        if spec.is_aot and load:
            try:
                spec.build_and_load()
                state += ", loads"
            except Exception as exc:  # report every module, then fail
                state += f", does not load: {exc}"
                ok = False
        ok = ok and spec.is_aot
        print(f"  {state}: {spec.name}", flush=True)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".fi_aot"))
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64])
    parser.add_argument("--check", action="store_true", help="check the installed set, build none")
    parser.add_argument("--load", action="store_true", help="with --check: load each module too")
    args = parser.parse_args()
    if args.check:
        sys.exit(0 if check(args.head_dims, args.load) else 1)
    build(args.out, args.head_dims)


if __name__ == "__main__":
    main()
