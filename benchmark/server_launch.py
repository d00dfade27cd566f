"""Start a RadixGen server for a benchmark run and wait until it is healthy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_server(server_args: list[str], timeout_s: float = 300) -> tuple[subprocess.Popen, str]:
    """`python -m radixgen.launch_server` on a free port -> (process, base URL) once /health is 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "radixgen.launch_server", "--port", str(port),
           "--log-level", "warning", *server_args]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/health", timeout_s)
    return proc, url


def wait_until_up(proc: subprocess.Popen, probe_url: str, timeout_s: float) -> None:
    """Poll `probe_url` until it answers 200; SystemExit if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server {proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(probe_url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not answer {probe_url} within {timeout_s:.0f} s")
