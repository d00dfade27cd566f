"""The `radixgen` command and `python -m radixgen.launch_server` flags (real subprocesses)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .server_process import server_flags

FLAGS = (
    "--model-path", "--tokenizer-path", "--host", "--port", "--dtype", "--context-length",
    "--max-total-tokens", "--mem-fraction-static", "--max-running-requests",
    "--max-queued-requests", "--chunked-prefill-size", "--schedule-policy",
    "--disable-radix-cache", "--grammar-backend", "--served-model-name", "--chat-template",
    "--api-key", "--stream-interval", "--log-level", "--enable-metrics",
)  # fmt: skip


@pytest.mark.parametrize(
    "cmd",
    [
        [sys.executable, "-m", "radixgen.cli", "serve", "--help"],
        [sys.executable, "-m", "radixgen.launch_server", "--help"],
    ],
)
def test_help_lists_sglang_flags(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for flag in FLAGS:
        assert flag in out, flag
    assert "(default: 30000)" in out


def test_bad_flag_value_is_a_clear_error():
    r = subprocess.run(
        [sys.executable, "-m", "radixgen.launch_server", "--max-running-requests", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "max_running_requests" in r.stderr


@pytest.mark.slow  # starts an Engine in a subprocess
def test_generate_one_shot():
    r = subprocess.run(
        [sys.executable, "-m", "radixgen.cli", "generate", "--prompt", "The capital of France is",
         "--max-new-tokens", "4", *server_flags()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()
