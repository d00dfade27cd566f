"""The instruction-set variants the native CPU library is built in, and which this CPU runs.

Each variant is the same C sources compiled with one fixed `-march` level (not `-march=native`):
its library runs on every CPU that has the variant's features, so one kernel cache can be shared
by different machines and a build can be tested on any richer CPU. The C code picks its paths
by the compiler's feature macros (`__AVX512BF16__`, `__AVX512F__`, `__AVX2__`, `__ARM_NEON`).
The model runner's loader (scheduler process) takes the best variant this CPU runs, or the one
RADIXGEN_CPU_ISA names (a lower one, for tests and comparisons).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from .cpu_features import cpu_flags

ISA_ENV = "RADIXGEN_CPU_ISA"  # a variant's name: use it instead of the best one

# x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE) and below, as /proc/cpuinfo names them
_X86_V3 = frozenset(
    {"sse4_1", "sse4_2", "ssse3", "popcnt", "cx16", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2",
     "abm", "movbe", "xsave"}
)  # fmt: skip
_X86_V4 = _X86_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@dataclass(frozen=True)
class IsaVariant:
    """One build of the kernels: its name, the machine it runs on, its compiler flags and the
    CPU features (/proc/cpuinfo's names) it needs."""

    name: str
    machine: str  # platform.machine()
    cflags: tuple[str, ...]
    needs: frozenset[str]
    summary: str

    def missing(self, flags: frozenset[str]) -> list[str]:
        """The features this variant needs that `flags` lacks (sorted)."""
        return sorted(self.needs - flags)


# best first: the loader takes the first one this CPU runs
VARIANTS: tuple[IsaVariant, ...] = (
    IsaVariant(
        "avx512bf16",
        "x86_64",
        ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"),
        _X86_V4 | {"avx512_bf16", "avx512_vnni"},
        "AVX-512 with AVX512-BF16 dot products (Cooper Lake, Sapphire Rapids, Zen 4 and later)",
    ),
    IsaVariant(
        "avx512",
        "x86_64",
        ("-march=x86-64-v4",),
        _X86_V4,
        "AVX-512F/BW/DQ/VL without BF16 (Skylake-SP, Ice Lake)",
    ),
    IsaVariant(
        "avx2",
        "x86_64",
        ("-march=x86-64-v3",),
        _X86_V3,
        "AVX2 + FMA + F16C (Haswell and later, Zen 1-3)",
    ),
    IsaVariant("neon", "aarch64", ("-march=armv8-a",), frozenset({"asimd"}), "aarch64 NEON"),
)
BY_NAME = {v.name: v for v in VARIANTS}


def runnable_isas() -> list[str]:
    """The variants this CPU runs, best first (empty on other architectures or x86-64 CPUs
    without AVX2)."""
    machine, flags = platform.machine(), cpu_flags()
    return [v.name for v in VARIANTS if v.machine == machine and not v.missing(flags)]


def why_not_runnable(name: str) -> str | None:
    """None when this CPU runs variant `name`, else the reason (an unknown name, another
    machine, or the missing CPU features)."""
    variant = BY_NAME.get(name)
    if variant is None:
        return f"unknown CPU kernel variant {name!r} (known: {', '.join(BY_NAME)})"
    machine = platform.machine()
    if variant.machine != machine:
        return f"variant {name} is for {variant.machine}, this machine is {machine}"
    missing = variant.missing(cpu_flags())
    if missing:
        return f"variant {name} needs CPU features this CPU lacks: {', '.join(missing)}"
    return None


def chosen_isa() -> tuple[str | None, str]:
    """(the variant to load, or None, and why): RADIXGEN_CPU_ISA's if it names one this CPU
    runs, else the best this CPU runs."""
    forced = os.environ.get(ISA_ENV)
    if forced:
        reason = why_not_runnable(forced)
        return (None, f"{ISA_ENV}={forced}: {reason}") if reason else (forced, f"{ISA_ENV}")
    runnable = runnable_isas()
    if not runnable:
        return None, (
            f"no native kernel variant for this CPU ({platform.machine()}: the variants need "
            "x86-64 with AVX2+FMA+F16C or aarch64 NEON)"
        )
    return runnable[0], "the best variant this CPU runs"
