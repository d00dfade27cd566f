"""Helpers for RadixGen's child processes: logging, dying with the parent, IPC endpoint names."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Protocol

PARENT_POLL_S = 0.5


IPC_DIR_PREFIX = "radixgen-ipc-"
IPC_OWNER_FILE = "owner"  # "<pid> <process start time>" of the process that made the dir
IPC_PATH_MAX = 107  # a Unix socket's path: sockaddr_un.sun_path holds 107 characters and a NUL
# The longest socket path made inside an IPC dir: Python 3.11's forkserver listener
# (<tempdir>/pymp-XXXXXXXX/listener-XXXXXXXX), as child_main points the scheduler's tempdir at
# the IPC dir; ZMQ's endpoints ("scheduler-<dp rank>-doorbell") are shorter.
IPC_LONGEST_SOCKET = len("/pymp-12345678/listener-12345678")
IPC_SHORT_ROOTS = ("/tmp", "/dev/shm", "/var/tmp")  # where IPC dirs go when TMPDIR is too long


class ReadyPipe(Protocol):
    """A child process's one-way channel for its start-up report (child_main's ReadyChannel; a
    multiprocessing Connection fits too)."""

    def send(self, msg: dict[str, object]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PortArgs:
    """ZMQ ipc:// endpoints in a private temporary directory.

    The directory's name starts with its owner's pid and an `owner` file identifies the owner
    exactly (pid and start time, as pids are reused), so a later start can tell a dead server's
    leftover (after a SIGKILL) from a live server's directory: see `remove_stale_ipc_dirs`.
    """

    tokenizer_ipc: str  # detokenizer / scheduler -> tokenizer manager
    scheduler_input_ipc: str  # tokenizer manager -> scheduler
    detokenizer_ipc: str  # scheduler -> detokenizer
    ipc_dir: str

    @classmethod
    def create(cls) -> PortArgs:
        d = tempfile.mkdtemp(prefix=f"{IPC_DIR_PREFIX}{os.getpid()}-", dir=ipc_root())
        with open(os.path.join(d, IPC_OWNER_FILE), "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())}")
        return cls(f"ipc://{d}/tokenizer", f"ipc://{d}/scheduler", f"ipc://{d}/detokenizer", d)

    def scheduler_input_for(self, dp_rank: int) -> str:
        """The input endpoint of data-parallel replica `dp_rank` (replica 0 keeps the one name)."""
        if dp_rank == 0:
            return self.scheduler_input_ipc
        return f"{self.scheduler_input_ipc}-{dp_rank}"

    def remove(self) -> None:
        shutil.rmtree(self.ipc_dir, ignore_errors=True)


def _ipc_dir_fits(root: str) -> bool:
    """Do the socket paths inside an IPC dir made under `root` fit a Unix socket address?"""
    ipc_dir = os.path.join(root, f"{IPC_DIR_PREFIX}{os.getpid()}-12345678")  # mkdtemp adds 8
    return len(ipc_dir) + IPC_LONGEST_SOCKET <= IPC_PATH_MAX


def ipc_root() -> str:
    """Where this process makes its IPC dir: the temp folder (TMPDIR), unless socket paths under
    it would pass the 107-character limit of a Unix socket address (a deep TMPDIR, as on
    clusters); then the first short writable folder of IPC_SHORT_ROOTS. OSError when none fits."""
    preferred = tempfile.gettempdir()
    for root in (preferred, *IPC_SHORT_ROOTS):
        if _ipc_dir_fits(root) and os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK):
            return root
    raise OSError(
        f"no folder for the server's sockets: the temp folder {preferred!r} is too long for "
        f"Unix socket paths (at most {IPC_PATH_MAX} characters) and none of "
        f"{', '.join(IPC_SHORT_ROOTS)} is writable; set TMPDIR to a short writable folder"
    )


def doorbell_endpoint(scheduler_endpoint: str) -> str:
    """Where the scheduler listening on `scheduler_endpoint` hears that an interactive request
    was sent to it (runtime/scheduler/step_interrupt.py)."""
    return f"{scheduler_endpoint}-doorbell"


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _owner_alive(path: str, name: str) -> bool:
    """Does the process that made this IPC dir still run? Unknown owners count as alive."""
    pid_text = name[len(IPC_DIR_PREFIX) :].split("-", 1)[0]
    if not pid_text.isdigit():
        return True  # not made by this version (no pid in the name): never ours to remove
    pid = int(pid_text)
    started = _start_time(pid)
    if started is None:
        return False
    try:
        with open(os.path.join(path, IPC_OWNER_FILE)) as f:
            owner_pid, owner_started = f.read().split()
    except (OSError, ValueError):
        return True  # being created right now by a live process with that pid
    return int(owner_pid) == pid and abs(float(owner_started) - started) < 1.0


def remove_stale_ipc_dirs(root: str | None = None) -> list[str]:
    """Remove the IPC dirs of dead servers (a SIGKILL leaves them behind) under `root`, or under
    the temp folder and the folder `ipc_root` picks; returns their paths."""
    if root is not None:
        roots = [root]
    else:
        roots = [tempfile.gettempdir()]
        try:
            roots.append(ipc_root())
        except OSError:
            pass
    removed = []
    for folder in dict.fromkeys(roots):  # once each, in order
        try:
            names = [n for n in os.listdir(folder) if n.startswith(IPC_DIR_PREFIX)]
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not _owner_alive(path, name):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def configure_logging(log_level: str, process_name: str) -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format=f"%(asctime)s [{process_name}] %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def configure_child_process(process_name: str, log_level: str) -> None:
    """Die with the parent (no orphans), leave Ctrl-C to the parent, set up logging.

    NOTE: the parent is watched by pid, not with PR_SET_PDEATHSIG: that signal fires when the
    *thread* that started the child exits, which would kill an Engine created in a worker thread.
    """
    parent = int(os.environ.get("RADIXGEN_PARENT_PID", os.getppid()))
    if os.getppid() != parent:  # the parent is already gone
        os._exit(0)

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch_parent, name="radixgen-parent-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    configure_logging(log_level, process_name)
