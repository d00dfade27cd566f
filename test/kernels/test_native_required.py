"""RADIXGEN_REQUIRE_NATIVE=1 turns a failed native build into an error; without it the torch path
serves. Each case runs in a fresh interpreter (the loader caches its answer per process) with an
empty kernel cache and a broken compiler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# each case runs a fresh interpreter that builds (or fails to build) the kernels: ~1.6 s apiece
pytestmark = pytest.mark.slow

LOAD = (
    "from radixgen.kernels.cpu import select_native_kernels\n"
    "import torch\n"
    "print('kernels:', select_native_kernels('cpu', torch.float32))\n"
)


def _fake_compiler(tmp_path: Path, on_compile: str) -> Path:
    """A `cc` that answers --version and then runs `on_compile` (sh) instead of compiling."""
    cc = tmp_path / "fakecc"
    cc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "fakecc 1.0"; exit 0; fi\n'
        'for a; do case "$prev" in -o) out="$a";; esac; prev="$a"; done\n'
        f"{on_compile}\n"
    )
    cc.chmod(0o755)
    return cc


def _run(tmp_path: Path, cc: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RADIXGEN_")}
    full.update(CC=cc, RADIXGEN_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=full, timeout=300
    )


def _cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """failure -> (CC, what the error must say)."""
    failing = _fake_compiler(tmp_path, 'echo "fatal error: boom.h: no such file" >&2; exit 1')
    (tmp_path / "junk").mkdir()
    junk = _fake_compiler(tmp_path / "junk", 'echo "not an ELF file" > "$out"')
    return {
        "no compiler": (str(tmp_path / "missing" / "cc"), "not found"),
        "compile error": (str(failing), "boom.h"),
        "load error": (str(junk), "loading"),
    }


@pytest.mark.parametrize("failure", ["no compiler", "compile error", "load error"])
def test_required_native_raises_a_clear_error(tmp_path: Path, failure: str) -> None:
    cc, says = _cases(tmp_path)[failure]
    proc = _run(tmp_path, cc, RADIXGEN_REQUIRE_NATIVE="1")
    assert proc.returncode != 0, proc.stdout
    assert "NativeBuildError: RADIXGEN_REQUIRE_NATIVE=1 but" in proc.stderr, proc.stderr
    assert says in proc.stderr


@pytest.mark.parametrize("failure", ["no compiler", "compile error", "load error"])
def test_without_the_requirement_the_torch_path_serves(tmp_path: Path, failure: str) -> None:
    cc, says = _cases(tmp_path)[failure]
    proc = _run(tmp_path, cc)
    assert proc.returncode == 0, proc.stderr
    assert "kernels: None" in proc.stdout
    assert "native CPU kernels unavailable, using the torch path" in proc.stderr
    assert says in proc.stderr


def test_disabled_wins_over_required(tmp_path: Path) -> None:
    proc = _run(
        tmp_path,
        str(tmp_path / "missing" / "cc"),
        RADIXGEN_REQUIRE_NATIVE="1",
        RADIXGEN_DISABLE_NATIVE="1",
    )
    assert proc.returncode == 0, proc.stderr
    assert "kernels: None" in proc.stdout


@pytest.mark.parametrize("required", [False, True])
def test_an_unwritable_cache_is_a_build_failure(tmp_path: Path, required: bool) -> None:
    """A cache directory that cannot be made (here: below a plain file, which stops root too)
    falls back to torch, or fails clearly under the requirement; it never crashes start-up."""
    (tmp_path / "a_file").write_text("")
    full = {k: v for k, v in os.environ.items() if not k.startswith("RADIXGEN_")}
    full["RADIXGEN_CACHE_DIR"] = str(tmp_path / "a_file" / "cache")
    if required:
        full["RADIXGEN_REQUIRE_NATIVE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=full, timeout=300
    )
    assert "building the native kernels in" in proc.stderr, proc.stderr
    if required:
        assert proc.returncode != 0 and "NativeBuildError" in proc.stderr
    else:
        assert proc.returncode == 0 and "kernels: None" in proc.stdout, proc.stderr
