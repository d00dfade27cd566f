"""A grammar compile worker process, and the scheduler-side handle that starts and kills it.

The worker runs in its own process so that a compile past its deadline can be stopped for real:
the scheduler kills the process and every byte the compile held goes back to the OS, which a
thread cannot offer. Workers come from a 'forkserver' (never a plain fork: the scheduler has
torch threads) that has imported the backend's library once, so a replacement after a kill
starts in a fraction of a second instead of re-importing torch and xgrammar (seconds here).
The worker builds its backend once, then answers (kind, spec) jobs with the serialized compiled
grammar. It exits when the scheduler is gone, even after a SIGKILL: the forkserver exits with
the scheduler, and the worker watches both.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.registry import GRAMMAR_BACKENDS, create_grammar_backend
from radixgen.runtime.constrained.vocab import GrammarVocab

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from radixgen.server_args import GrammarConfig

PARENT_CHECK_SECONDS = 0.5


@dataclass(frozen=True)
class CompileResult:
    """What a worker sends back: a serialized grammar and its size, or a 400's message."""

    payload: str | None
    size_bytes: int
    error: str | None = None
    error_kind: str | None = None


def run_compile_worker_process(
    conn: Connection, backend_name: str, vocab: GrammarVocab, config: GrammarConfig, owner: int
) -> None:
    """Entry point of a worker: build the backend, then compile jobs until told to stop."""
    threading.Thread(target=_exit_with_owner, args=(owner, os.getppid()), daemon=True).start()
    backend = create_grammar_backend(backend_name, vocab, config)
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the scheduler closed its end
            return
        if job is None:
            return
        kind, spec = job
        compiled: Any = None
        try:
            compiled = backend.compile(kind, spec)
            result = CompileResult(
                backend.serialize_compiled(compiled), backend.compiled_size_bytes(compiled)
            )
        except GrammarError as e:
            result = CompileResult(None, 0, str(e), e.param)
        except Exception as e:  # any library failure is this spec's fault: a 400 for it
            result = CompileResult(None, 0, f"invalid {kind}: {e}", kind)
        compiled = None  # freed before the next job, not after it
        conn.send(result)


def _exit_with_owner(owner: int, parent: int) -> None:
    """Exit once the scheduler (`owner`) or the process that forked us (`parent`) is gone."""
    while os.getppid() == parent and _pid_exists(owner):
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)  # the scheduler is gone: nobody will read our answer


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_context(backend_name: str) -> mp.context.ForkServerContext:
    """The 'forkserver' context, its server preloading the backend's module (and torch)."""
    ctx: mp.context.ForkServerContext = mp.get_context("forkserver")
    module = "radixgen.runtime.constrained." + GRAMMAR_BACKENDS[backend_name].split(":")[0]
    # NOTE: takes effect when this process first starts its forkserver (then it is reused)
    ctx.set_forkserver_preload([__name__, module, "radixgen.runtime.constrained.forkserver_hooks"])
    return ctx


class CompileWorker:
    """The scheduler's handle on one worker process; used by one driver thread only."""

    def __init__(
        self, backend_name: str, vocab: GrammarVocab, config: GrammarConfig, start_timeout: float
    ) -> None:
        ctx = worker_context(backend_name)
        self.conn, child_conn = ctx.Pipe(duplex=True)
        # NOTE: the vocabulary goes without its `encode` closure (not picklable, not needed by a
        # backend that compiles in a worker)
        args = (child_conn, backend_name, _picklable(vocab), config, os.getpid())
        self.process: BaseProcess = ctx.Process(
            target=run_compile_worker_process, args=args, name="radixgen-grammar", daemon=True
        )
        self.process.start()
        child_conn.close()
        if not self.conn.poll(start_timeout):
            self.kill()
            raise RuntimeError(f"the grammar compile worker did not start in {start_timeout:g} s")
        try:
            assert self.conn.recv() == "ready"
        except (EOFError, OSError) as e:
            self.kill()
            raise RuntimeError(
                f"the grammar compile worker exited at start ({self.process.exitcode})"
            ) from e

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def compile(self, kind: str, spec: str, timeout: float) -> CompileResult | None:
        """The worker's answer, or None when it took longer than `timeout` (worker then killed).

        Raises `EOFError` when the worker died during the compile (a crash in the library).
        """
        self.conn.send((kind, spec))
        if not self.conn.poll(timeout):
            self.kill()
            return None
        result: Any = self.conn.recv()
        assert isinstance(result, CompileResult)
        return result

    def signal_kill(self) -> None:
        """SIGKILL the process, from any thread (its driver then sees the pipe close)."""
        if self.process.is_alive():
            self.process.kill()

    def kill(self) -> None:
        """Stop the process now (SIGKILL): its memory goes back to the OS. Driver thread only."""
        self.signal_kill()
        self.process.join(5.0)
        self.conn.close()

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it is busy."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(0.5)
        self.kill()


def _picklable(vocab: GrammarVocab) -> GrammarVocab:
    return GrammarVocab(
        vocab.token_bytes,
        vocab.eos_token_ids,
        vocab.special_token_ids,
        vocab.special_token_names,
        None,
    )
