"""The native kernels' instruction-set variants: which this CPU runs, RADIXGEN_CPU_ISA forcing a
lower one, and refusing one the CPU cannot run (never a SIGILL)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from radixgen.kernels.cpu import cpu_flags, runnable_isas
from radixgen.kernels.cpu.isa import BY_NAME, ISA_ENV, VARIANTS, chosen_isa, why_not_runnable

LOAD = (
    "from radixgen.kernels.cpu import select_native_kernels\n"
    "import torch\n"
    "k = select_native_kernels('cpu', torch.float32)\n"
    "print('isa:', None if k is None else k.isa)\n"
)


def _load(**env: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter (the loader caches its choice per process) with `env`."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RADIXGEN_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=full, timeout=300
    )


def test_runnable_variants_follow_the_cpu_flags_best_first() -> None:
    flags, machine = cpu_flags(), platform.machine()
    runnable = runnable_isas()
    for v in VARIANTS:
        assert (v.name in runnable) == (v.machine == machine and v.needs <= flags), v.name
    order = [v.name for v in VARIANTS]
    assert runnable == sorted(runnable, key=order.index)
    if machine == "x86_64" and "avx2" in flags and "fma" in flags:
        assert "avx2" in runnable
    assert chosen_isa()[0] == (runnable[0] if runnable else None)


def test_reasons_name_the_missing_features() -> None:
    assert "unknown CPU kernel variant 'sse9'" in (why_not_runnable("sse9") or "")
    other = "neon" if platform.machine() == "x86_64" else "avx2"
    assert f"is for {BY_NAME[other].machine}" in (why_not_runnable(other) or "")
    for name in runnable_isas():
        assert why_not_runnable(name) is None


@pytest.mark.parametrize("isa", runnable_isas())
def test_the_environment_forces_a_variant(isa: str) -> None:
    proc = _load(**{ISA_ENV: isa})
    assert proc.returncode == 0, proc.stderr
    assert f"isa: {isa}" in proc.stdout


def test_a_variant_the_cpu_cannot_run_is_refused() -> None:
    other = "neon" if platform.machine() == "x86_64" else "avx2"
    proc = _load(**{ISA_ENV: other})
    assert proc.returncode == 0 and "isa: None" in proc.stdout, proc.stderr
    assert "native CPU kernels unavailable, using the torch path" in proc.stderr
    assert f"{ISA_ENV}={other}: variant {other} is for" in proc.stderr
    required = _load(**{ISA_ENV: other, "RADIXGEN_REQUIRE_NATIVE": "1"})
    assert required.returncode != 0
    assert "NativeBuildError: RADIXGEN_REQUIRE_NATIVE=1 but" in required.stderr
