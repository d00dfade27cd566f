"""Helpers for RadixGen's child processes: logging, parent-death signal, IPC endpoint names."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import tempfile
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1


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
    """Die with the parent (no orphans), leave Ctrl-C to the parent, set up logging."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # pragma: no cover - non-Linux
        pass
    parent = os.environ.get("RADIXGEN_PARENT_PID")
    if parent and os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    configure_logging(log_level, process_name)
