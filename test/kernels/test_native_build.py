"""Building the native kernels: warning-free sources, the cache key, the one cache directory."""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from radixgen.kernels.cpu import build
from radixgen.kernels.cpu.isa import BY_NAME, VARIANTS, chosen_isa
from radixgen.utils import cache_root

STRICT = ("-Wall", "-Wextra", "-Werror", "-Wmissing-prototypes")


@pytest.fixture(scope="module")
def compiler() -> build.Compiler:
    try:
        return build.find_compiler()
    except build.NativeBuildError as e:
        pytest.skip(str(e))


# the variant this CPU loads is built in the fast tier, the others (a compile each) in the slow one
BUILDS = [
    pytest.param(v.name, marks=() if v.name == chosen_isa()[0] else pytest.mark.slow)
    for v in VARIANTS
]
# NOTE: x86-64-v3 and x86-64-v4 are the avx2 and avx512 variants' own levels, built with the
# same flags as the variants (they were here too: 150 s of duplicate compiles on AVX2 CPUs)
MARCHES = ["cooperlake", "sapphirerapids"]
PARALLEL_COMPILES = 2  # each compile is one single-threaded cc1 at a time: two use both cores


def variant_command(compiler: build.Compiler, isa: str, out: Path) -> list[str] | str:
    """The loader's compile of variant `isa` with the strict warnings, or why it cannot run."""
    machine = BY_NAME[isa].machine
    if machine != platform.machine():  # the other architecture's variant: cross-compiled
        cross = shutil.which(f"{machine}-linux-gnu-gcc")
        if cross is None:
            return f"{isa} is for {machine}: needs {machine}-linux-gnu-gcc to cross-compile"
        compiler = build.Compiler(cross, cross, "cross")
    return build.compile_command(compiler, out, (*build.variant_cflags(isa), *STRICT))


def march_command(compiler: build.Compiler, march: str) -> list[str] | str:
    """Objects of every source at a CPU's own -march level, or why it cannot run."""
    if platform.machine() != "x86_64":
        return "x86 instruction sets"
    probe = [compiler.path, f"-march={march}", "-E", "-x", "c", "-", "-o", "/dev/null"]
    if subprocess.run(probe, input="", capture_output=True, text=True).returncode != 0:
        return f"{compiler.version} does not know -march={march}"
    flags = [f for f in build.CFLAGS if f != "-shared"]
    sources = [str(build.SOURCE_DIR / s) for s in build.SOURCES]
    return [compiler.path, *flags, f"-march={march}", *STRICT, "-c", *sources]


@pytest.fixture(scope="module")
def compiles(
    request: pytest.FixtureRequest,
    compiler: build.Compiler,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]] | str]]:
    """Every selected compile of this module, started at once two at a time (the suite runs one
    test at a time: the second core would idle through minutes of compiles). name -> its
    running compile, or why it is skipped."""
    wanted = {
        str(p)
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
        for key, p in item.callspec.params.items()
        if key in ("isa", "march")
    }
    jobs: dict[str, Future[subprocess.CompletedProcess[str]] | str] = {}
    with ThreadPoolExecutor(PARALLEL_COMPILES) as pool:
        for name in [v.name for v in VARIANTS] + MARCHES:
            if name not in wanted:
                continue
            folder = tmp_path_factory.mktemp(f"build-{name}")
            cmd = (
                variant_command(compiler, name, folder / "kernels.so")
                if name in BY_NAME
                else march_command(compiler, name)
            )
            jobs[name] = cmd if isinstance(cmd, str) else pool.submit(
                subprocess.run, cmd, capture_output=True, text=True, cwd=folder
            )  # fmt: skip
        yield jobs
        for job in jobs.values():  # a failed test leaves its compile to finish, not to leak
            if not isinstance(job, str):
                job.cancel()


def compiled(compiles: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
    job = compiles[name]
    if isinstance(job, str):
        pytest.skip(job)
    result: subprocess.CompletedProcess[str] = job.result()
    return result


@pytest.mark.parametrize("isa", BUILDS)
def test_sources_build_warning_free_with_the_production_flags(
    compiles: dict[str, Any], isa: str
) -> None:
    """Every variant with the flags the loader uses: this machine's architecture's with its
    compiler, the other's with Debian's cross compiler where installed (install.sh's test
    extras install it). -Wmissing-prototypes: every exported function has its prototype in
    radixgen_kernels.h."""
    proc = compiled(compiles, isa)
    assert proc.returncode == 0, proc.stderr
    assert (Path(proc.args[proc.args.index("-o") + 1])).exists()


@pytest.mark.slow  # two full compiles (60-120 s each on 2 cores): the build matrix
@pytest.mark.parametrize("march", MARCHES)
def test_every_instruction_set_path_compiles_warning_free(
    compiles: dict[str, Any], march: str
) -> None:
    """The CPUs' own -march levels beside the variants' (objects only, nothing runs): gcc once
    warned on the AVX-512 and AVX512-BF16 paths for some of them."""
    proc = compiled(compiles, march)
    assert proc.returncode == 0, proc.stderr


def test_cache_key_covers_the_compiler_flags_and_sources(
    compiler: build.Compiler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = build.cache_key(compiler)
    assert build.cache_key(compiler) == key
    other_version = dataclasses.replace(compiler, version=compiler.version + " (patched)")
    other_path = dataclasses.replace(compiler, resolved="/opt/other/bin/gcc")
    assert build.cache_key(other_version) != key
    assert build.cache_key(other_path) != key
    assert build.cache_key(compiler, (*build.CFLAGS, "-DEXTRA")) != key
    variants = {build.cache_key(compiler, build.variant_cflags(v.name)) for v in VARIANTS}
    assert len(variants) == len(VARIANTS)  # one library per variant
    for name in (*build.SOURCES, *build.HEADERS):
        (tmp_path / name).write_bytes((build.SOURCE_DIR / name).read_bytes())
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    assert build.cache_key(compiler) == key
    with (tmp_path / "radixgen_kernels.h").open("a") as f:
        f.write("\n")
    assert build.cache_key(compiler) != key


def test_compiler_identity_names_the_resolved_binary_and_version(
    compiler: build.Compiler,
) -> None:
    assert Path(compiler.resolved).is_file() and compiler.version
    assert compiler.resolved in compiler.identity and compiler.version in compiler.identity


def test_kernels_and_models_share_one_cache_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixgen.runtime.model_loader import resolve

    assert resolve.cache_root is cache_root  # the GGUF converter's cache
    monkeypatch.setenv("RADIXGEN_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    assert build.library_path("ab" * 32).parent == tmp_path / "kernels"
    monkeypatch.delenv("RADIXGEN_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "radixgen"
