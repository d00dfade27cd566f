"""IPC directories name their owner; a start removes those of dead owners and never a live one's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import zmq

from radixgen.runtime.launch import process_utils
from radixgen.runtime.launch.process_utils import (
    IPC_DIR_PREFIX,
    IPC_OWNER_FILE,
    IPC_PATH_MAX,
    PortArgs,
    doorbell_endpoint,
    remove_stale_ipc_dirs,
)

MAKE_DIR = (
    "import tempfile, sys; tempfile.tempdir = sys.argv[1]\n"
    "from radixgen.runtime.launch.process_utils import PortArgs\n"
    "print(PortArgs.create().ipc_dir)"
)


# a scheduler's grammar compile workers: a forkserver whose listener socket goes in tempdir
START_FORKSERVER = (
    "import multiprocessing as mp, os, sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
    "p = mp.get_context('forkserver').Process(target=os.getpid); p.start(); p.join()\n"
    "sys.exit(p.exitcode)"
)


@pytest.fixture
def short_tmp(monkeypatch):
    """A temp folder short enough for socket paths (pytest's tmp_path may not be)."""
    root = tempfile.mkdtemp(prefix="rg-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def deep_tmp(tmp_path, monkeypatch):
    """A temp folder too deep for socket paths inside an IPC dir, as a cluster's TMPDIR can be."""
    root = tmp_path / ("deep-" * 12)
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return str(root)


def test_dirs_of_dead_owners_are_removed_live_and_foreign_ones_kept(short_tmp):
    tmp_path = Path(short_tmp)
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
    shutil.rmtree(live)


def test_a_deep_temp_folder_puts_the_ipc_dir_where_its_sockets_fit(deep_tmp):
    # the limit is real: a forkserver in an IPC dir under the deep folder cannot start
    too_deep = os.path.join(deep_tmp, f"{IPC_DIR_PREFIX}{os.getpid()}-abcdefgh")
    os.mkdir(too_deep)
    failed = subprocess.run(
        [sys.executable, "-c", START_FORKSERVER, too_deep], capture_output=True, text=True
    )
    assert failed.returncode != 0 and "too long" in failed.stderr

    ports = PortArgs.create()
    try:
        assert not ports.ipc_dir.startswith(deep_tmp)
        assert os.path.dirname(ports.ipc_dir) in process_utils.IPC_SHORT_ROOTS
        # the longest ZMQ endpoint (a high data-parallel rank's doorbell) binds
        endpoint = doorbell_endpoint(ports.scheduler_input_for(99))
        assert len(endpoint) - len("ipc://") <= IPC_PATH_MAX
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.bind(endpoint)
        sock.close(0)
        ctx.term()
        # and the compile workers' forkserver starts with its sockets in the IPC dir
        started = subprocess.run(
            [sys.executable, "-c", START_FORKSERVER, ports.ipc_dir], capture_output=True, text=True
        )
        assert started.returncode == 0, started.stderr[-2000:]
        # a later start finds this dir if its owner is gone
        assert remove_stale_ipc_dirs() == []  # alive: kept
    finally:
        ports.remove()


def test_no_folder_short_enough_is_a_clear_error(deep_tmp, monkeypatch):
    monkeypatch.setattr(process_utils, "IPC_SHORT_ROOTS", ())
    with pytest.raises(OSError, match="set TMPDIR to a short writable folder"):
        PortArgs.create()


def test_a_dead_servers_dir_in_the_short_folder_is_removed(deep_tmp):
    dead = subprocess.run(
        [sys.executable, "-c", MAKE_DIR, deep_tmp], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert not dead.startswith(deep_tmp)
    assert dead in remove_stale_ipc_dirs() and not os.path.exists(dead)
