"""Building the native kernels: warning-free sources, the cache key, the one cache directory."""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
from pathlib import Path

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


@pytest.mark.parametrize("isa", BUILDS)
def test_sources_build_warning_free_with_the_production_flags(
    compiler: build.Compiler, tmp_path: Path, isa: str
) -> None:
    """Every variant with the flags the loader uses: this machine's architecture's with its
    compiler, the other's with Debian's cross compiler where installed (install.sh's test
    extras install it). -Wmissing-prototypes: every exported function has its prototype in
    radixgen_kernels.h."""
    machine = BY_NAME[isa].machine
    if machine != platform.machine():  # the other architecture's variant: cross-compiled
        cross = shutil.which(f"{machine}-linux-gnu-gcc")
        if cross is None:
            pytest.skip(f"{isa} is for {machine}: needs {machine}-linux-gnu-gcc to cross-compile")
        compiler = build.Compiler(cross, cross, "cross")
    out = tmp_path / "kernels.so"
    cmd = build.compile_command(compiler, out, (*build.variant_cflags(isa), *STRICT))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.exists()


# NOTE: x86-64-v3 and x86-64-v4 are the avx2 and avx512 variants' own levels, built with the
# same flags by the test above (they were here too: 150 s of duplicate compiles on AVX2 CPUs)
@pytest.mark.slow  # two full compiles (60-120 s each on 2 cores): the build matrix
@pytest.mark.parametrize("march", ["cooperlake", "sapphirerapids"])
def test_every_instruction_set_path_compiles_warning_free(
    compiler: build.Compiler, tmp_path: Path, march: str
) -> None:
    """The CPUs' own -march levels beside the variants' (objects only, nothing runs): gcc once
    warned on the AVX-512 and AVX512-BF16 paths for some of them."""
    if platform.machine() != "x86_64":
        pytest.skip("x86 instruction sets")
    probe = [compiler.path, f"-march={march}", "-E", "-x", "c", "-", "-o", "/dev/null"]
    if subprocess.run(probe, input="", capture_output=True, text=True).returncode != 0:
        pytest.skip(f"{compiler.version} does not know -march={march}")
    flags = [f for f in build.CFLAGS if f != "-shared"]
    sources = [str(build.SOURCE_DIR / s) for s in build.SOURCES]
    cmd = [compiler.path, *flags, f"-march={march}", *STRICT, "-c", *sources]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
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
