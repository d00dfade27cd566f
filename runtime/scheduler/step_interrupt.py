"""Cutting a step of batch lines short when an interactive request arrives (scheduler process).

A step whose rows are all batch lines (background work: the Batch API's and `radixgen batch`'s
requests) takes ~100 ms on a CPU, and the scheduler reads its input socket only between steps:
an interactive request arriving meanwhile waited for the rest of that step before its own
prefill, which more than doubled its time to first token. Now the TokenizerManager also sends
each interactive request's rid to a doorbell socket (process_utils' `doorbell_endpoint`) right
after the request. A thread here blocks on that socket; when the ring comes while an all-background step
runs, it sets the step's `CancelFlag`, the forward stops before its next layer
(`StepCancelled`), the step's KV slots are freed and the loop reads the new request, whose
prefill then runs alone (the planner's yield to interactive requests). The cut step's rows run
again later from the same state: outputs are unchanged, the work of the layers already run is
lost.

A ring can come before its request is read (two sockets, no order between them) or after (the
request was read between steps but is still compiling its grammar): `on_request` and the ring
match each rid once, so a step is cut only for a request the scheduler has not read yet, and each
ring cuts one step at most (a ring whose request never comes costs one step's partial work; it is
forgotten after STALE_S). The flag is only armed on a CPU with one
tensor-parallel rank (on a GPU the forward is queued, not run, and under tensor parallelism
every rank would have to stop at the same layer).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from radixgen.kernels.step_cancel import CancelFlag

if TYPE_CHECKING:
    import zmq

logger = logging.getLogger(__name__)

STALE_S = 2.0  # a ring (or a request read before its ring) older than this is forgotten
TRIM_AT = 1024  # entries in either table that make a ring or a read forget stale ones too
CUT_WAIT_MS = 20  # after a cut step, how long the loop waits for the request that rang


class StepInterrupt:
    """The cancel flag of the step in flight, and the thread that sets it on a doorbell ring."""

    def __init__(self) -> None:
        self.flag = CancelFlag()
        self._lock = threading.Lock()
        self._armed = False
        self._rung: dict[str, float] = {}  # rids rung whose request was not read yet -> when
        self._spent: dict[str, float] = {}  # of those, the rings that already cut a step
        self._read: dict[str, float] = {}  # rids read before their ring -> when
        self._thread: threading.Thread | None = None

    # --- the doorbell thread ------------------------------------------------------------------

    def listen(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        """Bind the doorbell socket and start the thread that owns it."""
        import zmq

        sock = ctx.socket(zmq.PULL)
        sock.bind(endpoint)
        self._thread = threading.Thread(
            target=self._watch, args=(sock,), name="radixgen-doorbell", daemon=True
        )
        self._thread.start()

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        while True:
            try:
                rid = sock.recv().decode()
            except Exception as e:  # NOTE: the context closed (shutdown): the thread ends
                logger.debug("doorbell thread ends: %s", e)
                return
            self.ring(rid)

    def ring(self, rid: str) -> None:
        """Interactive request `rid` was sent: cut the armed step unless it was already read."""
        with self._lock:
            if self._read.pop(rid, None) is not None:
                return
            self._rung[rid] = time.monotonic()
            if len(self._rung) > TRIM_AT:
                self._forget_stale()
            if self._armed:
                self.flag.set()

    # --- the scheduler thread -----------------------------------------------------------------

    def on_request(self, rid: str) -> None:
        """The scheduler read interactive request `rid` (it no longer needs a cut)."""
        with self._lock:
            if self._rung.pop(rid, None) is None and self._spent.pop(rid, None) is None:
                self._read[rid] = time.monotonic()
                if len(self._read) > TRIM_AT:
                    self._forget_stale()

    def arm(self) -> CancelFlag:
        """Before an all-background step: its flag, set at once when a request rang and was not
        read yet (the loop then reads it instead of running the step)."""
        with self._lock:
            if self._rung or self._spent or self._read:
                self._forget_stale()
            if self._rung:
                self.flag.set()
            else:
                self.flag.clear()
            self._armed = True
        return self.flag

    def disarm(self, cut: bool) -> None:
        """After the step; `cut`: it stopped, which spends the rings that were pending."""
        with self._lock:
            self._armed = False
            self.flag.clear()
            if cut:
                self._spent.update(self._rung)
                self._rung.clear()

    def _forget_stale(self) -> None:
        """Drop rings whose request never came and reads whose ring never came (the lock is
        held)."""
        now = time.monotonic()
        for table in (self._rung, self._spent, self._read):
            for rid in [r for r, t in table.items() if now - t > STALE_S]:
                del table[rid]
