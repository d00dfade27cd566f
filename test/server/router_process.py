"""Start the real SGLang router (the Rust router of `sglang-router`) and stop it (test helper)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

from .server_process import free_port

ROUTER_START_TIMEOUT_S = 60.0
# `python -m sglang_router.launch_router` with its arguments, minus the import of the Python
# fallback balancer (mini_lb), which imports the SGLang frontend when installed: 6 s of CPU per
# start here. The same argument parser and the same Rust router run.
_LAUNCH = """
import argparse, sys
from sglang_router.router import Router
from sglang_router.router_args import RouterArgs
parser = argparse.ArgumentParser()
RouterArgs.add_cli_args(parser)
args = RouterArgs.from_cli_args(parser.parse_args(sys.argv[1:]))
args._validate_router_args()
Router.from_args(args).start()
"""


class RouterProcess:
    """The SGLang router on free loopback ports (its Prometheus port too:
    the default, 29000, is shared by every router on the machine)."""

    def __init__(self, worker_urls: list[str], *extra_args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/radixgen-test-router-{self.port}.log"
        argv = [
            "--worker-urls", *worker_urls,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-port", str(free_port()),
            "--log-level", "warn", *(extra_args or ("--policy", "cache_aware")),
        ]  # fmt: skip
        cmd = [sys.executable, "-c", _LAUNCH, *argv]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_workers(self, n: int) -> list[dict]:
        """Until the router lists `n` healthy workers (it registers them in the background)."""
        deadline = time.monotonic() + ROUTER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited with {self.proc.returncode}: {self.log()}")
            try:
                workers = httpx.get(self.url + "/workers", timeout=2.0).json()["workers"]
            except (httpx.TransportError, ValueError, KeyError):
                workers = []
            if len(workers) == n and all(w["is_healthy"] for w in workers):
                return workers
            time.sleep(0.2)
        raise TimeoutError(f"router has no {n} healthy workers: {self.log()}")

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
