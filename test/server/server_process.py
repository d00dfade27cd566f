"""Start a real `python -m radixgen.launch_server` on a free loopback port and stop it (test helper)."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil

STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grammar_available() -> bool:
    """The grammar package (runtime/constrained/grammar_manager.py) is being written separately."""
    return importlib.util.find_spec("radixgen.runtime.constrained.grammar_manager") is not None


def default_grammar_args() -> list[str]:
    return [] if grammar_available() else ["--grammar-backend", "none"]


def server_flags() -> list[str]:
    """One intra-op thread: on a shared 2-core machine two OpenMP threads that lose their core to
    another process stall at every barrier (measured: 15 s vs 0.8 s for 8 tokens)."""
    return ["--num-threads", "1", "--log-level", "warning", *default_grammar_args()]


class ServerProcess:
    def __init__(self, *extra_args: str, log_path: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "radixgen.launch_server",
            "--port",
            str(self.port),
            *extra_args,
        ]
        self.log_path = log_path or f"/tmp/radixgen-test-server-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def health_status(self) -> int | None:
        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code
        except httpx.TransportError:
            return None

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> list[int | None]:
        """Poll /health until 200; returns every status seen (None = port not up yet)."""
        seen: list[int | None] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            code = self.health_status()
            if not seen or seen[-1] != code:
                seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.1)
        raise TimeoutError(f"server not healthy after {timeout} s: {self.log()}")

    def child_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


@contextmanager
def running_server(*extra_args: str) -> Iterator[ServerProcess]:
    """A healthy server for the block, stopped (its whole process tree) after it, even on failure."""
    proc = ServerProcess(*extra_args)
    try:
        proc.wait_healthy()
        yield proc
    finally:
        proc.stop()


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Pids still alive (and not zombies) after `timeout`."""
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
