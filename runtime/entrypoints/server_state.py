"""The API process's engine lifecycle: start the children after the port is up, watch, stop.

Loading the model takes seconds, so the children start on a dedicated thread once uvicorn has
bound its socket: `/health` answers 503 meanwhile, then 200 after a one-token warm-up; that thread
then waits for shutdown and stops the children (which also exit by themselves if this process
dies: they watch its pid). A watchdog task polls the children; when one dies the
TokenizerManager fails everything in flight with 503 and the server is told to exit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixgen.errors import EngineDeadError
from radixgen.runtime.batch.service import BatchService
from radixgen.runtime.entrypoints.http_utils import NotReadyError, ShuttingDownError
from radixgen.runtime.entrypoints.openai.files_batches import resume_batches
from radixgen.runtime.entrypoints.openai.responses_store import ResponseStore
from radixgen.runtime.launch.launcher import EngineProcesses, launch_engine_processes
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager
from radixgen.server_args import ServerArgs

if TYPE_CHECKING:
    from radixgen.runtime.request_side.metrics import ServerMetrics

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
DRAIN_POLL_S = 0.05
STOP_TIMEOUT_S = 10.0
CHILD_MODULE = "radixgen.runtime.launch.child_main"


class ServerState:
    """Everything a route needs: the TokenizerManager once ready, and why not otherwise."""

    def __init__(self, args: ServerArgs, request_exit: Callable[[int], None]) -> None:
        self.args = args
        self.started_at = time.time()
        self.ready_at: float | None = None
        self.tm: TokenizerManager | None = None
        self.procs: EngineProcesses | None = None
        self.metrics: ServerMetrics | None = None  # set by the HTTP server (--enable-metrics)
        self.dead_reason: str | None = None
        self._request_exit = request_exit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._starting_tm: TokenizerManager | None = None  # during the warm-up
        self.draining = False  # SIGTERM arrived: finish what runs, refuse the rest
        self._drain_task: asyncio.Task[None] | None = None
        self.batch: BatchService | None = None  # the Files / Batch APIs' state, opened on use
        self.responses = ResponseStore()  # /v1/responses' stored responses (in memory)

    # --- what routes call ---------------------------------------------------------------------

    def manager(self, while_draining: bool = False) -> TokenizerManager:
        """The TokenizerManager, or a 503 error saying why there is none (or, while draining,
        why no new work is taken: `while_draining` for what serves requests in flight)."""
        if self.dead_reason is not None:
            raise EngineDeadError(f"the engine is not running: {self.dead_reason}")
        if self.draining and not while_draining:
            raise ShuttingDownError(
                "the server is shutting down: it finishes the requests in flight and takes no "
                "new ones"
            )
        if self.tm is None:
            raise NotReadyError("the model is still loading; retry when /health returns 200")
        return self.tm

    @property
    def healthy(self) -> bool:
        return (
            self.tm is not None
            and self.dead_reason is None
            and self.tm.dead_reason is None
            and not self.draining
        )

    # --- graceful shutdown (SIGTERM) ----------------------------------------------------------

    def request_drain(self) -> None:
        """From the SIGTERM handler (between bytecodes): start the drain on the event loop (once;
        SIGINT still stops at once)."""
        if self._loop is None:
            self._request_exit(0)
            return
        if self.draining:
            return
        self.draining = True  # NOTE: at once: routes refuse new work from here on
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        """On the loop: let the requests in flight finish, then exit."""
        assert self._loop is not None
        self._drain_task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        timeout = self.args.http.graceful_shutdown_timeout
        tm = self.tm
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if tm is not None and tm.num_in_flight:
            logger.info("SIGTERM: draining %d requests (up to %.0f s)", tm.num_in_flight, timeout)
        while tm is not None and tm.num_in_flight and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if tm is not None and tm.num_in_flight:
            logger.warning(
                "%d requests still in flight after %.0f s: failing them", tm.num_in_flight, timeout
            )
            tm.fail_all(
                "the server shut down before the request finished "
                f"(graceful shutdown timeout {timeout:g} s)",
                503,
            )
        self._request_exit(0)

    # --- start ---------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(
            target=self._own_children, name="radixgen-engine", daemon=True
        )
        self._thread.start()

    def _own_children(self) -> None:
        """Thread body: launch, hand over to the loop, then hold the children until stop."""
        loop = self._loop
        assert loop is not None
        try:
            procs = launch_engine_processes(self.args)
            if procs.ready is None:
                raise RuntimeError("no scheduler reported ready on this machine")
            tm = TokenizerManager(
                self.args, procs.model_folder, procs.ports, procs.ready, procs.served_model_name
            )
        except BaseException as e:  # start-up failed: report it and exit the server
            if not self._stop.is_set():
                logger.error("engine start-up failed: %s", e)
                loop.call_soon_threadsafe(self._on_dead, f"start-up failed: {e}")
            return
        self.procs = procs
        if not self._stop.is_set():
            asyncio.run_coroutine_threadsafe(self._attach(tm), loop)
        self._stop.wait()
        procs.shutdown()

    async def _attach(self, tm: TokenizerManager) -> None:
        tm.start()
        self._starting_tm = tm
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())
        try:  # one real token (or vector) before /health says 200
            await tm.warm_up()
        except Exception as e:
            self._on_dead(f"warm-up failed: {e}")
            return
        if self.metrics is not None:
            self.metrics.set_model(
                tm.served_model_name, tm.context_length, self.args.cache.page_size
            )
        tm.metrics = self.metrics  # after the warm-up, so it is not counted
        self.tm = tm
        self.ready_at = time.time()
        resume_batches(self)
        assert self.procs is not None and self.procs.ready is not None
        logger.info(
            "ready to serve %s on http://%s:%d (model loaded in %.1f s)",
            self.procs.served_model_name,
            self.args.http.host,
            self.args.http.port,
            self.procs.ready.startup_seconds,
        )

    # --- watch and stop -----------------------------------------------------------------------

    async def _watch(self) -> None:
        while not self._stop.is_set():
            procs = self.procs
            dead = procs.dead_child() if procs is not None else None
            if dead:
                self._on_dead(dead)
                return
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _on_dead(self, reason: str) -> None:
        if self.dead_reason is not None or self._stop.is_set():
            return
        self.dead_reason = reason
        logger.error("engine is dead (%s): the server exits", reason)
        tm = self.tm or self._starting_tm
        if tm is not None:
            tm.mark_dead(reason)
        self._request_exit(1)

    async def stop(self) -> None:
        """Stop every child (also mid-load) and wait for them; called on server shutdown."""
        self._stop.set()
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self.batch is not None:  # its lines in flight stop unrecorded: they run again later
            await self.batch.close()
        if self.tm is not None:
            self.tm.close()
        if self.procs is None:
            # still loading: the launcher thread is blocked waiting for "ready"; ending the
            # children makes it fail fast and clean up its temp dir.
            _terminate_loading_children()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S)
        logger.info("engine processes stopped")


def _terminate_loading_children() -> None:
    import psutil

    children = [
        c for c in psutil.Process().children() if any(CHILD_MODULE in part for part in _cmdline(c))
    ]
    for c in children:
        try:
            c.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=5)
    for c in alive:
        c.kill()


def _cmdline(proc: Any) -> list[str]:
    try:
        return [str(part) for part in proc.cmdline()]
    except Exception:
        return []
