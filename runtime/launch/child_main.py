"""`python -m radixgen.runtime.launch.child_main ROLE SPEC`: the entry point of every child process.

Children are started as fresh interpreters (not multiprocessing's spawn), so the user's main
module is never re-imported: an Engine works from any script or notebook, guard or not. SPEC is a
pickle file with the role's arguments; the child reports ready (or its start-up error) by pushing
one message to the launcher's ZMQ endpoint.
"""

from __future__ import annotations

import pickle
import sys
import tempfile


def scheduler_role(dp_rank: int, tp_rank: int = 0) -> str:
    """The name a scheduler reports ready under: `scheduler`, or `scheduler-K` for replica K > 0,
    with `-tpR` for tensor-parallel rank R > 0."""
    name = "scheduler" if dp_rank == 0 else f"scheduler-{dp_rank}"
    return name if tp_rank == 0 else f"{name}-tp{tp_rank}"


class ReadyChannel:
    """Sends the one start-up report to the launcher."""

    def __init__(self, endpoint: str, role: str) -> None:
        import zmq

        self._ctx = zmq.Context(1)
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.connect(endpoint)
        self._role = role

    def send(self, msg: dict[str, object]) -> None:
        self._sock.send_pyobj({"role": self._role, **msg})

    def close(self) -> None:
        self._sock.close(linger=2000)
        self._ctx.term()


def main() -> None:
    role, spec_path = sys.argv[1], sys.argv[2]
    dp_rank = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # schedulers: the replica
    tp_rank = int(sys.argv[4]) if len(sys.argv) > 4 else 0  # and the tensor-parallel rank
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    channel = ReadyChannel(
        spec["ready_endpoint"], scheduler_role(dp_rank, tp_rank) if role == "scheduler" else role
    )
    if role == "scheduler":
        from radixgen.runtime.scheduler.scheduler_process import run_scheduler_process

        # NOTE: temp files of this process (the grammar compile forkserver's socket folder,
        # multiprocessing's pymp-*) go into the IPC folder, which the launcher removes when the
        # server stops, even after a SIGKILL; in the default temp folder they were left behind.
        tempfile.tempdir = spec["ports"].ipc_dir

        run_scheduler_process(
            spec["args"], spec["model_folder"], spec["ports"], channel, dp_rank, tp_rank
        )
    elif role == "detokenizer":
        from radixgen.runtime.detokenizer.detokenizer_manager import run_detokenizer_process

        run_detokenizer_process(
            spec["model_folder"],
            spec["tokenizer_path"],
            spec["chat_template"],
            spec["ports"],
            channel,
            spec["log_level"],
        )
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
