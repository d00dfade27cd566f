"""The Triton layer kernels compile for the H200 (sm_90) on a machine without a GPU.

The interpreter runs a kernel's Python body, not Triton's compiler, so what only compilation
rejects (types of constexpr branches, pointer casts, block shapes) would first fail on the lent
GPU. This compiles every kernel once per dtype branch the model takes, down to a cubin, with
the ptxas Triton ships. On a CUDA machine the native tests compile them anyway (skipped there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.triton_interpret,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the native tests compile them"),
]


def variants() -> list[tuple[str, str, dict[str, str], dict[str, Any]]]:
    """(module, kernel, pointer/scalar types, constexprs) per dtype branch."""
    norm = dict(residual_ptr="*fp32", hidden="i32", eps="fp32")
    rope = dict(positions_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", loc_ptr="*i64")
    rope["stride_qkv"] = "i32"
    mask = dict(bitmask_ptr="*i32", rows_ptr="*i64", vocab="i32", words="i32")
    mask.update(stride_logits="i32", stride_mask="i32")
    out = []
    for x, w, has_x in [("bf16", "bf16", True), ("fp32", "fp32", True), ("fp32", "bf16", False)]:
        types = dict(norm, x_ptr=f"*{x}", weight_ptr=f"*{w}", out_ptr=f"*{w}")
        out.append(("norm", "_add_rmsnorm_kernel", types, dict(HAS_X=has_x, BLOCK=1024)))
    for i, o in [("bf16", "bf16"), ("fp32", "bf16"), ("fp32", "fp32")]:
        types = dict(gate_up_ptr=f"*{i}", out_ptr=f"*{o}", inter="i32")
        out.append(("activation", "_silu_mul_kernel", types, dict(BLOCK=1024)))
    for i, o, (h, hkv, d) in [
        ("bf16", "bf16", (9, 3, 64)),
        ("fp32", "bf16", (4, 1, 128)),
        ("fp32", "fp32", (9, 3, 64)),
    ]:
        types = dict(rope, qkv_ptr=f"*{i}", q_ptr=f"*{o}", k_pool_ptr=f"*{o}", v_pool_ptr=f"*{o}")
        consts = dict(HEADS=h, KV_HEADS=hkv, HEAD_DIM=d, BLOCK_D=d, BF16_MATH=i == o == "bf16")
        consts.update(BLOCK_H=1 << (h - 1).bit_length(), BLOCK_KV=1 << (hkv - 1).bit_length())
        out.append(("rotary_kv", "_rope_store_kv_kernel", types, consts))
    for dt, has_rows in [("fp32", True), ("bf16", False)]:
        types = dict(mask, logits_ptr=f"*{dt}")
        out.append(("bitmask", "_apply_bitmask_kernel", types, dict(HAS_ROWS=has_rows, BLOCK=1024)))
    return out


def compile_all() -> list[str]:
    """Compile every variant; the failures, one line each."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = []
    for module, kernel, types, consts in variants():
        fn = getattr(importlib.import_module(f"radixgen.kernels.triton.{module}"), kernel)
        signature = {n: "constexpr" if n in consts else types[n] for n in fn.arg_names}
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature, constexprs=consts),
                target=GPUTarget("cuda", 90, 32),
            )
            assert compiled.asm["cubin"], "no cubin"
        except Exception as e:  # reported, then the test fails
            failures.append(f"{kernel} {consts}: {type(e).__name__}: {str(e)[:1500]}")
    return failures


def test_kernels_compile_for_sm90() -> None:
    """In a child without TRITON_INTERPRET: under it `triton.jit` gives interpreted functions,
    which the compiler cannot take."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton's own default, stated (silences a warning)
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


if __name__ == "__main__":
    problems = compile_all()
    print("\n".join(problems) or f"{len(variants())} kernel variants compiled for sm_90")
    sys.exit(1 if problems else 0)
