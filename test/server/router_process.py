"""Start a router and stop it (test helper): the real SGLang router (the Rust router of
`sglang-router`), or ours (`radixgen router`)."""

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


class _RouterProc:
    """A router child process on a free loopback port: its log, its /workers list and its stop."""

    headers: dict[str, str]  # sent with its /workers reads (the router's API key)

    def _start(self, cmd: list[str]) -> None:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def _workers_now(self) -> list[dict]:
        try:
            r = httpx.get(self.url + "/workers", headers=self.headers, timeout=2.0)
            return r.json()["workers"]
        except (httpx.TransportError, ValueError, KeyError):
            return []

    def _wait(self, done, what: str, timeout: float = ROUTER_START_TIMEOUT_S) -> list[dict]:
        """Until `done(workers)` holds for the router's /workers list."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited with {self.proc.returncode}: {self.log()}")
            workers = self._workers_now()
            if done(workers):
                return workers
            time.sleep(0.2)
        raise TimeoutError(f"router has not {what}: {self.log()}")

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


class RouterProcess(_RouterProc):
    """The SGLang router on free loopback ports (its Prometheus port too:
    the default, 29000, is shared by every router on the machine)."""

    def __init__(self, worker_urls: list[str], *extra_args: str) -> None:
        self.headers = {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/radixgen-test-router-{self.port}.log"
        argv = [
            "--worker-urls", *worker_urls,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-port", str(free_port()),
            "--log-level", "warn", *(extra_args or ("--policy", "cache_aware")),
        ]  # fmt: skip
        self._start([sys.executable, "-c", _LAUNCH, *argv])

    def wait_workers(self, n: int) -> list[dict]:
        """Until the router lists `n` healthy workers (it registers them in the background)."""
        return self._wait(
            lambda ws: len(ws) == n and all(w["is_healthy"] for w in ws), f"{n} healthy workers"
        )


class ModelRouterProcess(_RouterProc):
    """`radixgen router` (python -m radixgen.cli router) on a free loopback port."""

    def __init__(self, urls: list[str], *extra: str, api_key: str | None = None) -> None:
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if api_key:
            extra = (*extra, "--api-key", api_key)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/radixgen-test-model-router-{self.port}.log"
        cmd = [sys.executable, "-m", "radixgen.cli", "router", "--worker-urls", *urls]
        self._start([*cmd, "--port", str(self.port), "--log-level", "warning", *extra])

    def wait_workers(self, healthy: int) -> list[dict]:
        """Until exactly `healthy` of the listed workers are up."""
        return self._wait(
            lambda ws: bool(ws) and sum(w["is_healthy"] for w in ws) == healthy,
            f"{healthy} healthy workers",
        )

    def workers(self) -> dict[str, dict]:
        r = httpx.get(self.url + "/workers", headers=self.headers)
        return {w["url"]: w for w in r.json()["workers"]}
