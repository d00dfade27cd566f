"""The grammar compile pool: a fair queue of compiles served by worker slots (scheduler process).

Each slot is a driver thread here plus, for backends whose compiled grammars can cross
processes (xgrammar), a worker process (`compile_worker.py`); other backends compile on the
driver thread itself. The scheduler thread only submits and reads futures, so it never blocks.

- The deadline (`grammar_compile_timeout`) counts from when a compile STARTS on a slot, so
  time spent queueing never fails a request. A worker past the deadline is killed (its memory
  returned) and replaced on the next job; every request waiting on that spec gets the 400.
  A thread cannot be stopped: for thread backends the waiting requests are failed at the
  deadline (`expire_overruns`), the library call runs on and its slot stays busy until it ends.
- Fair service: the queue is served smallest spec first (a `(yes|no)` regex never waits
  behind a 20 kB schema), and specs over LARGE_SPEC_BYTES may hold at most `workers - 1`
  slots at once, so one slot is always left for small specs. Large specs are what can take
  long (compile time grows with a schema's size and depth), so one client's expensive grammars
  delay another's cheap one by at most one small compile, not by a timeout.
- Workers start in the background once the scheduler is up (`start`, from the grammar
  manager's warm-up thread; a spawned worker imports xgrammar and torch: 1-3 s here), so the
  first constrained request after a start does not wait for them (it waited ~2.6 s when they
  started on the first job); a pool nobody warmed starts them on its first job.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixgen.errors import GrammarError
from radixgen.runtime.constrained.compile_worker import CompileWorker

if TYPE_CHECKING:
    from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend
    from radixgen.runtime.constrained.compile_cache import GrammarKey
    from radixgen.server_args import GrammarConfig

logger = logging.getLogger(__name__)

# specs above this many characters count as "large" (possibly slow) for the fairness rule
LARGE_SPEC_BYTES = 2048
WORKER_START_TIMEOUT = 120.0


@dataclass(order=True)
class _Job:
    size: int
    seq: int
    key: GrammarKey = field(compare=False)
    future: Future[Any] = field(compare=False)
    queued_at: float = field(compare=False)
    started_at: float | None = field(default=None, compare=False)

    @property
    def large(self) -> bool:
        return self.size > LARGE_SPEC_BYTES


class GrammarCompileTimeout(GrammarError):
    """A compile past grammar_compile_timeout (another backend is not tried: it would wait too)."""


def timeout_error(kind: str, timeout: float) -> GrammarError:
    return GrammarCompileTimeout(
        f"compiling the {kind} constraint took longer than {timeout:g} s "
        "(grammar_compile_timeout); simplify it",
        kind,
    )


@dataclass
class CompilePoolCounters:
    """A pool's counters, all 0 until its first compile (the grammar manager adds the pools' up,
    the `*_max` ones taking the largest). Floats, counts among them: /server_info has always
    shown them so."""

    grammar_compiles: float = 0.0
    grammar_compile_seconds_total: float = 0.0
    grammar_compile_seconds_max: float = 0.0
    grammar_compile_queue_seconds_max: float = 0.0
    grammar_compile_timeouts: float = 0.0
    grammar_compile_worker_starts: float = 0.0
    grammar_compile_worker_start_seconds_max: float = 0.0
    grammar_compile_worker_kills: float = 0.0
    grammar_compile_worker_crashes: float = 0.0

    def add(self, other: CompilePoolCounters) -> None:
        """Count another pool's in: counts and totals added, each `*_max` the larger."""
        self.grammar_compiles += other.grammar_compiles
        self.grammar_compile_seconds_total += other.grammar_compile_seconds_total
        self.grammar_compile_seconds_max = max(
            self.grammar_compile_seconds_max, other.grammar_compile_seconds_max
        )
        self.grammar_compile_queue_seconds_max = max(
            self.grammar_compile_queue_seconds_max, other.grammar_compile_queue_seconds_max
        )
        self.grammar_compile_timeouts += other.grammar_compile_timeouts
        self.grammar_compile_worker_starts += other.grammar_compile_worker_starts
        self.grammar_compile_worker_start_seconds_max = max(
            self.grammar_compile_worker_start_seconds_max,
            other.grammar_compile_worker_start_seconds_max,
        )
        self.grammar_compile_worker_kills += other.grammar_compile_worker_kills
        self.grammar_compile_worker_crashes += other.grammar_compile_worker_crashes


class CompilePool:
    """`submit(key)` returns a future of the backend's compiled grammar (or its GrammarError)."""

    def __init__(self, backend: BaseGrammarBackend, config: GrammarConfig) -> None:
        self.backend = backend
        self.config = config
        self.workers = config.grammar_compile_workers
        self.in_processes = backend.compiles_in_worker_process
        self._cond = threading.Condition()
        self._queue: list[_Job] = []
        self._seq = itertools.count()
        self._large_running = 0
        self._running: dict[int, _Job] = {}  # slot -> its job
        self._processes: dict[int, CompileWorker] = {}  # slot -> its live worker
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.counters = CompilePoolCounters()

    def submit(self, key: GrammarKey) -> Future[Any]:
        future: Future[Any] = Future()
        job = _Job(len(key[1]), next(self._seq), key, future, time.monotonic())
        with self._cond:
            if self._closed:
                raise RuntimeError("the grammar compile pool is shut down")
            self._start_slots()  # NOTE: a pool nobody started: its first job starts the slots
            heapq.heappush(self._queue, job)
            self._cond.notify_all()
        return future

    def start(self) -> None:
        """Start the slots now: each driver thread starts its worker process before it waits for
        a job, so compiles do not wait for the workers' start-up."""
        with self._cond:
            if not self._closed:
                self._start_slots()

    def _start_slots(self) -> None:
        if self._threads:  # under self._cond
            return
        for slot in range(self.workers):
            t = threading.Thread(
                target=self._drive, args=(slot,), name=f"radixgen-grammar-{slot}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def worker_pids(self) -> list[int]:
        """Process ids of the live compile workers (for tests and diagnostics)."""
        with self._cond:
            return [w.pid for w in self._processes.values() if w.pid is not None]

    def queued(self) -> int:
        """Compiles waiting for a slot."""
        return len(self._queue)

    def expire_overruns(self) -> None:
        """Fail thread-compiled jobs past their deadline (worker processes enforce their own)."""
        if self.in_processes:
            return
        now = time.monotonic()
        timeout = self.config.grammar_compile_timeout
        with self._cond:
            late = [
                j for j in self._running.values() if j.started_at and now - j.started_at > timeout
            ]
        for job in late:
            if _settle(job.future, error=timeout_error(job.key[0], timeout)):
                self.counters.grammar_compile_timeouts += 1

    def shutdown(self) -> None:
        """Fail queued compiles, kill the workers (running compiles end with them)."""
        with self._cond:
            self._closed = True
            queued, self._queue = self._queue, []
            workers = list(self._processes.values())
            self._cond.notify_all()
        for job in queued:
            job.future.cancel()
        for worker in workers:  # NOTE: only a signal: each pipe is closed by its own driver
            worker.signal_kill()
        for t in self._threads:
            t.join(5.0)

    # --- driver threads -----------------------------------------------------------------------

    def _next_job(self, slot: int) -> _Job | None:
        with self._cond:
            while not self._closed:
                job = self._queue[0] if self._queue else None
                # NOTE: the head is the smallest spec: if it is large, every queued one is
                if job is not None and not (
                    job.large and self.workers > 1 and self._large_running >= self.workers - 1
                ):
                    heapq.heappop(self._queue)
                    self._large_running += job.large
                    self._running[slot] = job
                    return job
                self._cond.wait()
            return None

    def _finish_job(self, slot: int, job: _Job) -> None:
        with self._cond:
            self._large_running -= job.large
            self._running.pop(slot, None)
            self._cond.notify_all()

    def _drive(self, slot: int) -> None:
        while True:
            if self.in_processes and not self._closed:
                self._ensure_worker(slot)  # ready before the job: start-up is not its wait
            job = self._next_job(slot)
            if job is None:
                break
            try:
                if job.future.set_running_or_notify_cancel():
                    self._run(slot, job)
            except Exception as e:  # a failure of ours must cost only this compile
                logger.exception("grammar compile of a %s spec failed", job.key[0])
                _settle(job.future, error=e)
            finally:
                self._finish_job(slot, job)
        worker = self._processes.pop(slot, None)
        if worker is not None:
            worker.stop()

    def _run(self, slot: int, job: _Job) -> None:
        kind, spec = job.key
        timeout = self.config.grammar_compile_timeout
        if not self.in_processes:
            self._started(job)
            try:
                compiled = self.backend.compile(kind, spec)
            except GrammarError as e:
                _settle(job.future, error=e)
            else:
                _settle(job.future, result=compiled)
            finally:
                self._compiled(job)
            return
        worker = self._worker(slot)
        self._started(job)
        try:
            result = worker.compile(kind, spec, timeout)
        except (EOFError, OSError):  # the library crashed the worker on this spec
            self._drop_worker(slot)
            self.counters.grammar_compile_worker_crashes += 1
            code = worker.process.exitcode
            _settle(
                job.future,
                error=GrammarError(
                    f"invalid {kind}: the compiler crashed on it (exit {code})", kind
                ),
            )
            return
        self._compiled(job)
        if result is None:  # past the deadline: the worker was killed
            self._drop_worker(slot)
            self.counters.grammar_compile_timeouts += 1
            self.counters.grammar_compile_worker_kills += 1
            _settle(job.future, error=timeout_error(kind, timeout))
        elif result.error is not None:
            _settle(job.future, error=GrammarError(result.error, result.error_kind or kind))
        else:
            assert result.payload is not None
            _settle(job.future, result=self.backend.deserialize_compiled(result.payload))

    def _ensure_worker(self, slot: int) -> None:
        try:
            self._worker(slot)
        except Exception:  # the job that comes next will retry and report it
            logger.exception("starting a grammar compile worker failed")

    def _worker(self, slot: int) -> CompileWorker:
        worker = self._processes.get(slot)
        if worker is not None and worker.process.is_alive():
            return worker
        start = time.monotonic()
        worker = CompileWorker(
            self.backend.name, self.backend.vocab, self.config, WORKER_START_TIMEOUT
        )
        elapsed = time.monotonic() - start
        c = self.counters
        c.grammar_compile_worker_starts += 1
        c.grammar_compile_worker_start_seconds_max = max(
            c.grammar_compile_worker_start_seconds_max, elapsed
        )
        with self._cond:
            if self._closed:
                worker.kill()
                raise RuntimeError("the grammar compile pool is shut down")
            self._processes[slot] = worker
        logger.info("grammar compile worker %d started in %.2f s", worker.pid, elapsed)
        return worker

    def _drop_worker(self, slot: int) -> None:
        with self._cond:
            worker = self._processes.pop(slot, None)
        if worker is not None:
            worker.kill()

    def _started(self, job: _Job) -> None:
        job.started_at = time.monotonic()
        c = self.counters
        c.grammar_compile_queue_seconds_max = max(
            c.grammar_compile_queue_seconds_max, job.started_at - job.queued_at
        )

    def _compiled(self, job: _Job) -> None:
        assert job.started_at is not None
        elapsed = time.monotonic() - job.started_at
        c = self.counters
        c.grammar_compiles += 1
        c.grammar_compile_seconds_total += elapsed
        c.grammar_compile_seconds_max = max(c.grammar_compile_seconds_max, elapsed)


def _settle(future: Future[Any], result: Any = None, error: BaseException | None = None) -> bool:
    """Complete `future` unless it already is (an expired thread compile); True if it was set."""
    if future.done():
        return False
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except Exception:  # InvalidStateError: completed concurrently
        return False
    return True
