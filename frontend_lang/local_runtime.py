"""Runtime: SGLang's launcher class, starting a local `radixgen` HTTP server process for programs.

`Runtime(model_path=..., **server_args)` takes SGLang's ServerArgs keyword names: they become
`python -m radixgen.launch_server` flags, checked here first by the same parser (so a refused
SGLang flag or a bad value fails at once, naming itself, before any process starts). The
server's log goes to a file whose tail comes with any start failure. Runs in the user's process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import IO, Any

import requests

from radixgen.json_types import JSONObject, JSONValue
from radixgen.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixgen.server_args import add_cli_args, from_cli_namespace
from radixgen.sglang_flags import foreign_flag_notes

DEFAULT_PORT = 30000  # SGLang's: the first free port from here up is taken
LOG_TAIL_CHARS = 4000
STOP_GRACE_S = 20.0


def kwargs_to_argv(kwargs: Mapping[str, object]) -> list[str]:
    """`{"tp_size": 1, "disable_radix_cache": True}` -> launch flags, checked by the server's own
    parser; False asks for `--no-<flag>` where the flag has one and is left out otherwise."""
    import argparse

    parser = argparse.ArgumentParser(prog="Runtime", exit_on_error=False)
    add_cli_args(parser)
    argv: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if flag not in parser._option_string_actions:
            raise TypeError(f"Runtime() got an unknown server argument {key!r}")
        if value is None:
            continue
        if value is True:
            argv.append(flag)
        elif value is False:
            negated = "--no-" + key.replace("_", "-")
            if negated in parser._option_string_actions:
                argv.append(negated)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentError as e:
        raise ValueError(f"Runtime(): {e}") from e
    from_cli_namespace(ns)  # our values refused here raise InvalidRequestError, naming the flag
    foreign_flag_notes(ns)  # as do SGLang flags refused here
    return argv


def first_free_port(start: int, host: str = "127.0.0.1") -> int:
    for port in range(start, 65536):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {start} up")


def _stop_tree(pid: int, log_file: IO[bytes] | None = None) -> None:
    """SIGTERM the server (it stops its engine processes), then SIGKILL whatever of the tree is
    left after the grace period: no orphans. Safe to call twice."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree[:1]:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    if log_file is not None:
        log_file.close()


class Runtime:
    """A local server for DSL programs: `rg.set_default_backend(rg.Runtime(...))` or
    `with rg.Runtime(...) as runtime:`; `shutdown()` (also at exit and when collected) stops it."""

    def __init__(
        self,
        model_path: str | None = None,
        log_level: str = "error",
        launch_timeout: float = 300.0,
        **server_args: Any,  # Any: SGLang's launch flags, forwarded to the server's parser
    ) -> None:
        self.pid: int | None = None
        host = str(server_args.pop("host", "127.0.0.1"))
        port = first_free_port(int(server_args.pop("port", DEFAULT_PORT)), host)
        flags = {"model_path": model_path, "host": host, "port": port, "log_level": log_level}
        self.server_args: dict[str, object] = {**flags, **server_args}
        argv = kwargs_to_argv(self.server_args)
        self.url = f"http://{host}:{port}"
        self.generate_url = self.url + "/generate"
        self.log_path = os.path.join(tempfile.gettempdir(), f"radixgen-runtime-{port}.log")
        log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed by _stop_tree
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "radixgen.launch_server", *argv]
        self._proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        self.pid = self._proc.pid
        # NOTE: a finalizer, not atexit.register(self.shutdown): it also runs when the object is
        # collected, and holds no reference to it
        self._finalizer = weakref.finalize(self, _stop_tree, self.pid, log_file)
        try:
            self._wait_healthy(launch_timeout)
            self.endpoint = RuntimeEndpoint(self.url)
        except BaseException:
            self.shutdown()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with requests.Session() as session:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    raise RuntimeError(
                        f"the server exited with status {code} while starting; its log "
                        f"({self.log_path}) ends:\n{self.log_tail()}"
                    )
                try:
                    if session.get(self.url + "/health", timeout=2.0).status_code == 200:
                        return
                except requests.RequestException:
                    pass
                time.sleep(0.2)
        raise TimeoutError(
            f"the server was not healthy within {timeout} s; its log ({self.log_path}) ends:\n"
            f"{self.log_tail()}"
        )

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-LOG_TAIL_CHARS:]
        except OSError:
            return ""

    def shutdown(self) -> None:
        """Stop the server and every process it started (idempotent)."""
        if self.pid is not None:
            self._finalizer()
            self.pid = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Runtime({self.url!r}, running={self.pid is not None})"

    # --- SGLang's conveniences ---------------------------------------------------------------

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def flush_cache(self) -> None:
        self.endpoint.flush_cache()

    async def get_server_info(self) -> JSONObject:
        """/server_info (async, as SGLang's Runtime has it)."""
        import asyncio

        return await asyncio.to_thread(self.endpoint.get_server_info)

    def get_tokenizer(self) -> Any:
        """The served model's Hugging Face tokenizer (from the folder the server loaded)."""
        from transformers import AutoTokenizer

        folder = self.endpoint.model_info.get("tokenizer_path")
        return AutoTokenizer.from_pretrained(folder or self.endpoint.get_model_name())

    def generate(
        self,
        prompt: str | list[str],
        sampling_params: Mapping[str, JSONValue] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        lora_path: str | list[str | None] | None = None,
        session_id: str | None = None,
    ) -> str:
        """POST /generate; returns the response as JSON text, as SGLang's Runtime does."""
        body = {
            "text": prompt,
            "sampling_params": sampling_params,
            "return_logprob": return_logprob,
            "logprob_start_len": logprob_start_len,
            "top_logprobs_num": top_logprobs_num,
            "lora_path": lora_path,
            "session_id": session_id,
        }
        body = {k: v for k, v in body.items() if v is not None}
        return json.dumps(requests.post(self.generate_url, json=body, timeout=600).json())

    async def async_generate(
        self, prompt: str, sampling_params: Mapping[str, JSONValue] | None = None
    ) -> AsyncIterator[str]:
        """Stream the text of one prompt as it is generated (new text per item)."""
        import aiohttp

        body = {"text": prompt, "sampling_params": sampling_params or {}, "stream": True}
        sent = 0
        timeout = aiohttp.ClientTimeout(total=3 * 3600)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(self.generate_url, json=body) as res,
        ):
            if res.status != 200:
                raise RuntimeError(f"/generate -> {res.status}: {await res.text()}")
            async for raw in res.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                text = json.loads(line[5:]).get("text", "")
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)

    add_request = async_generate
