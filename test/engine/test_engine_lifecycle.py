"""Engine processes: children die with their parent, whatever thread created the Engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from wait_helpers import wait_until

pytestmark = pytest.mark.slow  # starts an Engine in a subprocess and kills it

SCRIPT = """
import threading, time, radixgen
box = {}
t = threading.Thread(target=lambda: box.setdefault("e", radixgen.Engine(grammar_backend="none", num_threads=1)))
t.start(); t.join()  # the creating thread is gone: the engine must keep working
out = box["e"].generate("Hello", {"max_new_tokens": 2})
print("PIDS", *[p.pid for p in box["e"]._procs.procs.values()], out["meta_info"]["completion_tokens"], flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_children_exit_when_the_parent_is_killed():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 240
        while not line.startswith("PIDS") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "engine script exited early"
        *pids, done = (int(x) for x in line.split()[1:])
        assert done == 2 and len(pids) == 2 and all(_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up
        proc.wait()
        wait_until(
            lambda: not any(_alive(p) for p in pids),
            10,
            interval=0.1,
            what="orphaned engine processes to exit",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
