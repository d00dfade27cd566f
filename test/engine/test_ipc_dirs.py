"""IPC directories name their owner; a start removes those of dead owners and never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from radixgen.runtime.launch.process_utils import (
    IPC_DIR_PREFIX,
    IPC_OWNER_FILE,
    PortArgs,
    remove_stale_ipc_dirs,
)

MAKE_DIR = (
    "import tempfile, sys; tempfile.tempdir = sys.argv[1]\n"
    "from radixgen.runtime.launch.process_utils import PortArgs\n"
    "print(PortArgs.create().ipc_dir)"
)


def test_dirs_of_dead_owners_are_removed_live_and_foreign_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # made by a process that has exited since (as after a SIGKILL: nobody removed it)
    dead = subprocess.run(
        [sys.executable, "-c", MAKE_DIR, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.strip()
    live = PortArgs.create().ipc_dir  # ours: we are alive
    assert os.path.basename(live).startswith(f"{IPC_DIR_PREFIX}{os.getpid()}-")
    # our pid, but a different start time: the pid was reused, its owner is gone
    reused = tmp_path / f"{IPC_DIR_PREFIX}{os.getpid()}-reused"
    reused.mkdir()
    (reused / IPC_OWNER_FILE).write_text(f"{os.getpid()} 12345.0")
    # no pid in the name (an older version's dir, maybe of a live server): not ours to judge
    foreign = tmp_path / f"{IPC_DIR_PREFIX}abcdef12"
    foreign.mkdir()
    # a live process's dir whose owner file is not written yet
    fresh = tmp_path / f"{IPC_DIR_PREFIX}{os.getpid()}-fresh"
    fresh.mkdir()

    removed = remove_stale_ipc_dirs()
    assert sorted(removed) == sorted([dead, str(reused)])
    assert not os.path.exists(dead) and not reused.exists()
    assert os.path.isdir(live) and foreign.is_dir() and fresh.is_dir()
