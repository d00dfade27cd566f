"""Compile the native CPU kernels with the host's C compiler, one library per instruction-set
variant (isa.py) and cache key, into the per-machine cache (the scheduler process does it when
the model runner loads them)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from radixgen.utils import cache_root

from .isa import BY_NAME

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent
SOURCES = (
    "ragged_attention.c", "fused_ops.c", "gemm_bf16.c", "gemm_quant.c", "decoder_stack.c",
    "team.c",
)  # fmt: skip
HEADERS = (
    "cpu_common.h",
    "radixgen_kernels.h",
    "kv_quant.h",
    "attention_block.h",
    "attention_kvq.h",
    "attention_rows.h",
    "attention_rows_simd.h",
    "attention_simd.h",
    "simd.h",
    "gemm_quant_fma.h",
    "team.h",
)
# NOTE: -Wall costs nothing at run time; a warning from a compiler we have not tried is logged,
# and test/kernels/test_native_build.py keeps the sources clean under -Wall -Wextra -Werror.
# Every variant adds its own -march level (isa.py): never -march=native, so a library built on
# one machine runs on any other with the variant's features.
CFLAGS = (
    "-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=fast", "-Wall",
)  # fmt: skip
LDLIBS = ("-lm",)


class NativeBuildError(RuntimeError):
    """The native kernels cannot be had: no compiler, a compile error or a load error."""


@dataclass(frozen=True)
class Compiler:
    """A C compiler as found on this machine; `identity` is part of the cache key."""

    path: str  # as invoked (found on PATH or given by $CC)
    resolved: str  # symlinks followed
    version: str  # first line of `--version`

    @property
    def identity(self) -> str:
        return f"{self.path}\n{self.resolved}\n{self.version}"


def find_compiler() -> Compiler:
    """$CC, else gcc, else cc on PATH, checked to run."""
    name = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not name:
        raise NativeBuildError("no C compiler found (install gcc, or set CC)")
    path = shutil.which(name)
    if path is None:
        raise NativeBuildError(f"C compiler {name!r} not found")
    try:
        proc = subprocess.run(
            [path, "--version"], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"C compiler {path} does not run: {e}") from e
    version = proc.stdout.splitlines()[0] if proc.stdout else ""
    return Compiler(path, os.path.realpath(path), version)


def variant_cflags(isa: str) -> tuple[str, ...]:
    """The full compiler flags of variant `isa`'s library."""
    return (*CFLAGS, *BY_NAME[isa].cflags)


def cache_key(compiler: Compiler, cflags: Sequence[str] = CFLAGS) -> str:
    """Hash of everything the library's bytes depend on: sources, flags (the variant's -march
    level among them) and compiler; not the CPU it was built on."""
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes())
    h.update(" ".join(cflags).encode())
    h.update(compiler.identity.encode())
    return h.hexdigest()


def library_path(key: str, isa: str = "") -> Path:
    """Where the library built for `key` (of variant `isa`) lives in the per-machine cache."""
    prefix = f"radixgen_cpu_{isa}_" if isa else "radixgen_cpu_"
    return cache_root() / "kernels" / f"{prefix}{key[:16]}.so"


def compile_command(compiler: Compiler, out: Path, cflags: Sequence[str] = CFLAGS) -> list[str]:
    """The one command line that builds every source into the shared object `out`."""
    sources = [str(SOURCE_DIR / name) for name in SOURCES]
    return [compiler.path, *cflags, *sources, "-o", str(out), *LDLIBS]


def build_library(compiler: Compiler, out: Path, cflags: Sequence[str] = CFLAGS) -> str:
    """Compile into a temporary file beside `out`, then rename it into place (atomic: a
    concurrent loader sees no library or a whole one). Returns the compiler's warnings.

    Each source is compiled on its own, as many at once as this process may use cores (the
    first start waits for this: one compiler run over all sources took ~24 s on 2 AVX2 cores,
    ~65 s for the AVX-512 variants), then the objects are linked."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        compile_only = [f for f in cflags if f != "-shared"]
        jobs = [
            [compiler.path, *compile_only, "-c", str(SOURCE_DIR / name), "-o", f"{tmp}/{i}.o"]
            for i, name in enumerate(SOURCES)
        ]
        link = [compiler.path, *cflags, *(j[-1] for j in jobs), "-o", str(tmp_out), *LDLIBS]
        workers = max(1, min(len(jobs), len(os.sched_getaffinity(0))))
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda cmd: _run(compiler, cmd), jobs))
        if all(proc.returncode == 0 for _, proc in results):
            results.append(_run(compiler, link))
        for cmd, proc in results:
            if proc.returncode != 0:
                raise NativeBuildError(
                    f"compiling the native kernels failed (exit {proc.returncode}): "
                    f"{' '.join(cmd)}\n{proc.stderr.strip()}"
                )
        os.replace(tmp_out, out)
    return "\n".join(proc.stderr.strip() for _, proc in results if proc.stderr.strip())


def _run(compiler: Compiler, cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    try:
        return cmd, subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise NativeBuildError(f"C compiler {compiler.path} does not run: {e}") from e


def open_library(isa: str) -> ctypes.CDLL:
    """Variant `isa`'s compiled library for these sources, flags and compiler, built on first
    use (the caller checks that this CPU runs the variant)."""
    compiler = find_compiler()
    cflags = variant_cflags(isa)
    try:  # NOTE: a cache directory that cannot be written (or read) is a build failure too
        path = library_path(cache_key(compiler, cflags), isa)
        warnings = None if path.exists() else build_library(compiler, path, cflags)
    except OSError as e:
        raise NativeBuildError(f"building the native kernels in {cache_root()} failed: {e}") from e
    if warnings:
        logger.warning("native CPU kernels (%s) compiled with warnings:\n%s", isa, warnings[:2000])
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeBuildError(f"loading {path} failed: {e}") from e
