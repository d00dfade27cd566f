"""Helpers for RadixGen's child processes: logging, dying with the parent, IPC endpoint names."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass

PARENT_POLL_S = 0.5


@dataclass(frozen=True)
class PortArgs:
    """ZMQ ipc:// endpoints in a private temporary directory."""

    tokenizer_ipc: str  # detokenizer / scheduler -> tokenizer manager
    scheduler_input_ipc: str  # tokenizer manager -> scheduler
    detokenizer_ipc: str  # scheduler -> detokenizer
    ipc_dir: str

    @classmethod
    def create(cls) -> PortArgs:
        d = tempfile.mkdtemp(prefix="radixgen-ipc-")
        return cls(f"ipc://{d}/tokenizer", f"ipc://{d}/scheduler", f"ipc://{d}/detokenizer", d)


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
