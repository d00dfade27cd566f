"""The strict (-Werror) compile of every native variant, started as soon as the session's tests
are collected, at the lowest CPU priority.

Together they are minutes of single-threaded compiler time (the AVX512-BF16 ragged attention
alone ~55 s on these machines). Run in line, they held the suite up for ~2 minutes; started at
collection under `nice 19`, they take the CPU time the other tests leave idle (most of them wait
on servers, sockets and child processes) and are done, or nearly, when their test asks.
test/kernels/conftest.py starts them; test_native_build.py checks each one's result.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from radixgen.kernels.cpu import build
from radixgen.kernels.cpu.isa import BY_NAME, VARIANTS

STRICT = ("-Wall", "-Wextra", "-Werror", "-Wmissing-prototypes")


@dataclass
class StrictCompile:
    """One variant's compile: running (or done), or why it cannot run here."""

    command: list[str]
    folder: Path
    process: subprocess.Popen[bytes]

    @property
    def output(self) -> Path:
        return Path(self.command[self.command.index("-o") + 1])

    def wait(self) -> tuple[int, str]:
        """The compile's exit status and its messages."""
        code = self.process.wait()
        return code, (self.folder / "stderr.txt").read_text(errors="replace")


_jobs: dict[str, StrictCompile | str] = {}
_root: Path | None = None


def variant_command(compiler: build.Compiler, isa: str, out: Path) -> list[str] | str:
    """The loader's compile of variant `isa` with the strict warnings, or why it cannot run."""
    machine = BY_NAME[isa].machine
    if machine != platform.machine():  # the other architecture's variant: cross-compiled
        cross = shutil.which(f"{machine}-linux-gnu-gcc")
        if cross is None:
            return f"{isa} is for {machine}: needs {machine}-linux-gnu-gcc to cross-compile"
        compiler = build.Compiler(cross, cross, "cross")
    return build.compile_command(compiler, out, (*build.variant_cflags(isa), *STRICT))


def start(names: set[str]) -> None:
    """Start the compiles of these variants (each once per session), all at once: the scheduler
    gives them only the idle time of both cores."""
    global _root
    try:
        compiler = build.find_compiler()
    except build.NativeBuildError as e:
        for name in names:
            _jobs.setdefault(name, str(e))
        return
    for name in [v.name for v in VARIANTS if v.name in names and v.name not in _jobs]:
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="radixgen-strict-compiles-"))
        folder = _root / name
        folder.mkdir()
        command = variant_command(compiler, name, folder / "kernels.so")
        if isinstance(command, str):
            _jobs[name] = command
            continue
        nice = shutil.which("nice")  # not preexec_fn: unsafe in a process with threads (torch)
        with (folder / "stderr.txt").open("wb") as stderr:
            process = subprocess.Popen(
                [nice, "-n", "19", *command] if nice else command,
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=subprocess.STDOUT,
            )
        _jobs[name] = StrictCompile(command, folder, process)


def job(name: str) -> StrictCompile | str:
    """Variant `name`'s compile (started now if the session did not), or why it cannot run."""
    if name not in _jobs:
        start({name})
    return _jobs[name]


def stop_all() -> None:
    """End the compiles still running (a test run cut short) and remove their folders."""
    for item in _jobs.values():
        if isinstance(item, StrictCompile) and item.process.poll() is None:
            item.process.kill()
            item.process.wait()
    _jobs.clear()
    global _root
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
        _root = None
