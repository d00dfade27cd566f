"""Building the native kernels: warning-free sources, the cache key, the one cache directory."""

from __future__ import annotations

import dataclasses
import platform
import re
import subprocess
from pathlib import Path

import pytest
import strict_compiles

from radixgen.kernels.cpu import build
from radixgen.kernels.cpu.isa import BY_NAME, VARIANTS, chosen_isa
from radixgen.utils import cache_root


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
def test_sources_build_warning_free_with_the_production_flags(isa: str) -> None:
    """Every variant with the flags the loader uses: this machine's architecture's with its
    compiler, the other's with Debian's cross compiler where installed (install.sh's test
    extras install it). -Wmissing-prototypes: every exported function has its prototype in
    radixgen_kernels.h. The compiles started when the session was collected (strict_compiles)."""
    job = strict_compiles.job(isa)
    if isinstance(job, str):
        pytest.skip(job)
    code, messages = job.wait()
    assert code == 0, messages
    assert job.output.exists()


# CPUs the AVX-512 variants run on, by the variant their build is: the loader compiles a
# variant's fixed flags, never -march=native, so the variant's build above is the code they run
MARCHES = {"cooperlake": "avx512bf16", "sapphirerapids": "avx512bf16", "skylake-avx512": "avx512"}
FEATURE_MACRO = re.compile(r"\b(__[A-Z][A-Z0-9_]*__)\b")


def defined_macros(compiler: build.Compiler, flags: list[str]) -> set[str]:
    probe = [compiler.path, *flags, "-dM", "-E", "-x", "c", "-", "-o", "-"]
    proc = subprocess.run(probe, input="", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define")}


@pytest.mark.parametrize("march", MARCHES)
def test_cpus_own_march_levels_select_the_code_of_their_variant(
    compiler: build.Compiler, march: str
) -> None:
    """Every feature macro the sources branch on is defined at the CPU's own -march level
    exactly as in its variant's flags: the sources compile to the same paths as the variant's
    warning-free build (where two full -march compiles ran: ~60 s of CI). A source that
    branches on a feature beyond its variant's (AVX512-FP16, AMX) fails here: it needs a
    variant that enables it."""
    if platform.machine() != "x86_64":
        pytest.skip("x86 instruction sets")
    probe = [compiler.path, f"-march={march}", "-E", "-x", "c", "-", "-o", "/dev/null"]
    if subprocess.run(probe, input="", capture_output=True).returncode != 0:
        pytest.skip(f"{compiler.version} does not know -march={march}")
    text = "\n".join(
        line
        for name in (*build.SOURCES, *build.HEADERS)
        for line in (build.SOURCE_DIR / name).read_text().splitlines()
        if line.lstrip().startswith("#if") or line.lstrip().startswith("#elif")
    )
    branched = set(FEATURE_MACRO.findall(text))
    assert "__AVX512F__" in branched and "__AVX2__" in branched  # the scan sees the branches
    flags = [f for f in build.CFLAGS if f != "-shared"]
    own = defined_macros(compiler, [*flags, f"-march={march}"]) & branched
    variant = defined_macros(compiler, [*flags, *BY_NAME[MARCHES[march]].cflags]) & branched
    assert own == variant, f"-march={march} differs from {MARCHES[march]} on {own ^ variant}"


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
