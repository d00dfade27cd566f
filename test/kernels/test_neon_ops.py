"""The aarch64 NEON variant of the fused ops, the greedy argmax and the ragged attention (bf16,
int8 and fp8 pools), cross-compiled and run under qemu-user, against the same harness built
for this x86-64 machine's AVX2 variant (whose kernels the other kernel tests hold to the torch
oracle): both compute in float32 over simd.h at different widths, so their bf16 outputs agree
to a bf16 rounding step and the argmax exactly; on both, a prefill chunk's rows (read together)
and decode rows on one cached prefix (its key blocks read once for all) give each row's result
alone bit for bit."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from radixgen.kernels.cpu import build
from radixgen.kernels.cpu.isa import BY_NAME, why_not_runnable

HARNESS = Path(__file__).parent / "native_harness" / "ops_harness.c"
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64-static", "/usr/aarch64-linux-gnu"
SOURCES = ("ragged_attention.c", "fused_ops.c", "team.c")


def _build(cc: str, isa: str, out: Path) -> Path:
    cmd = [cc, *BY_NAME[isa].cflags, "-O3", "-fopenmp", "-std=c11", "-ffp-contract=fast",
           "-Wall", "-Wextra", "-Werror", f"-I{build.SOURCE_DIR}", str(HARNESS),
           *(str(build.SOURCE_DIR / s) for s in SOURCES), "-o", str(out), "-lm"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def _parse(text: str) -> dict[str, torch.Tensor]:
    rows = {}
    for line in text.splitlines():
        name, *vals = line.split()
        rows[name] = torch.tensor([float(v) for v in vals if v != "rc"], dtype=torch.float64)
    return rows


def test_neon_ops_under_qemu_agree_with_the_x86_variant(tmp_path):
    missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    if missing or not Path(SYSROOT).is_dir():
        pytest.skip(
            f"needs {', '.join(missing) or SYSROOT} to check the aarch64 variant (Debian: "
            "apt-get install gcc-aarch64-linux-gnu qemu-user-static)"
        )
    if platform.machine() != "x86_64" or why_not_runnable("avx2") is not None:
        pytest.skip("the reference outputs come from the avx2 variant on an x86-64 CPU")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    with ThreadPoolExecutor(2) as pool:  # two single-threaded compiles: both cores
        neon_job = pool.submit(_build, CROSS_CC, "neon", tmp_path / "ops_neon")
        host_job = pool.submit(_build, build.find_compiler().path, "avx2", tmp_path / "ops_avx2")
        neon, host = neon_job.result(), host_job.result()
    got = subprocess.run([QEMU, "-L", SYSROOT, str(neon)], capture_output=True, text=True,
                         timeout=600, env=env)  # fmt: skip
    assert got.returncode == 0, got.stderr
    ref = subprocess.run([str(host)], capture_output=True, text=True, timeout=600, env=env)
    assert ref.returncode == 0, ref.stderr
    a, b = _parse(got.stdout), _parse(ref.stdout)
    alone = {f"{case}{kind}" for case in ("alone", "shared") for kind in (1, 2, 3)}
    assert a.keys() == b.keys() == {"attn1", "attn2", "attn3", "silu", "norm", "argmax"} | alone
    for name in a:
        assert a[name].shape == b[name].shape and torch.isfinite(a[name]).all(), name
        if name in alone:  # rows read together give each row's result alone, bit for bit
            assert a[name].tolist() == b[name].tolist() == [0], name
        elif name == "argmax":
            assert a[name].tolist() == b[name].tolist() == [123, 17]  # first max, first NaN
        else:  # one bf16 rounding step (8 significant bits) at most
            torch.testing.assert_close(a[name], b[name], rtol=2**-7, atol=1e-6, msg=name)
