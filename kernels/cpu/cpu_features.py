"""This CPU's feature flags, read once per process from /proc/cpuinfo: the kernel variant, the
model dtype and the GEMM choice (all in the scheduler process) ask here."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def _cpu_flags_line() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            # x86: "flags : ...", aarch64: "Features : ..."
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    return frozenset(_cpu_flags_line().partition(":")[2].split())


def has_amx_bf16() -> bool:
    """AMX tiles: oneDNN's bf16 GEMM uses them, which the native GEMM does not."""
    return "amx_bf16" in cpu_flags()


def has_fast_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16 makes bf16 matmuls fast on this CPU."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())
