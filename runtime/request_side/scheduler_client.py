"""The TokenizerManager's client of the scheduler (API process): `SchedulerLink` sends requests,
aborts and control messages to it and matches control replies to their requests by id.

`SchedulerLink` is the plain `--dp-size 1` path: one PUSH socket, every message sent as is. With
`--dp-size N` its subclass `DataParallelController` (`dp_router.py`) holds one socket per replica
and routes each request; control messages go to every replica, and the TokenizerManager merges
their internal states (`summed_internal_state`). Outputs never pass through here: every
scheduler sends to the detokenizer, which sends to the TokenizerManager.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import zmq
import zmq.asyncio

from radixgen.io_struct import (
    AbortReq,
    ControlReply,
    ControlRequest,
    TokenizedEmbeddingReq,
    TokenizedGenerateReq,
)
from radixgen.runtime.launch.process_utils import doorbell_endpoint


class SchedulerLink:
    """One scheduler: sends everything to it (today's path, unchanged by data parallelism)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self._socks = [ctx.socket(zmq.PUSH)]
        self._socks[0].connect(endpoint)
        self._waiters: dict[str, asyncio.Future[ControlReply]] = {}  # replies by request_id
        self._endpoints = [endpoint]
        self._doorbells: list[zmq.Socket[bytes]] = []  # one per replica, once opened

    def open_doorbells(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        """Ring each replica's doorbell after every interactive request (the schedulers
        listen: `SchedulerReadyOut.interruptible`). Plain sockets, sent without waiting: a ring
        that cannot be queued is dropped (that request then waits for the step in flight)."""
        for endpoint in self._endpoints:
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(doorbell_endpoint(endpoint))
            self._doorbells.append(sock)

    def close_doorbells(self) -> None:
        for sock in self._doorbells:
            sock.close(linger=0)
        self._doorbells = []

    def _ring(self, rank: int, msg: TokenizedGenerateReq | TokenizedEmbeddingReq) -> None:
        if not self._doorbells or not isinstance(msg, TokenizedGenerateReq) or msg.background:
            return
        try:
            self._doorbells[rank].send(msg.rid.encode(), zmq.NOBLOCK)
        except zmq.Again:
            pass

    @property
    def num_replicas(self) -> int:
        return len(self._socks)

    async def send_request(
        self, msg: TokenizedGenerateReq | TokenizedEmbeddingReq, rank: int | None = None
    ) -> int:
        """Send a request (to replica `rank` if given, else where the policy says); its rank."""
        await self._socks[0].send_pyobj(msg)
        self._ring(0, msg)
        return 0

    def send_abort(self, msg: AbortReq) -> Any:
        """Send an abort where its request runs (every replica for abort_all); awaitable, or a
        future from sync code (zmq.asyncio sends at once when it can)."""
        return self._socks[0].send_pyobj(msg)

    async def control(self, req: ControlRequest, timeout: float) -> list[ControlReply]:
        """Send `req` to every replica (each copy with its own request_id) and wait for all the
        replies (matched by `on_control_reply`; a late one is dropped); in replica order."""
        loop = asyncio.get_running_loop()
        ids: list[str] = []
        try:
            for sock in self._socks:
                msg = dataclasses.replace(req, request_id=uuid.uuid4().hex)
                ids.append(msg.request_id)
                self._waiters[msg.request_id] = loop.create_future()
                await sock.send_pyobj(msg)
            return list(
                await asyncio.wait_for(asyncio.gather(*(self._waiters[i] for i in ids)), timeout)
            )
        finally:
            for request_id in ids:
                self._waiters.pop(request_id, None)

    def on_control_reply(self, msg: ControlReply) -> bool:
        """A replica's reply to `control`; False when nobody waits for it (any more)."""
        fut = self._waiters.pop(msg.request_id, None)
        if fut is None or fut.done():
            return False
        fut.set_result(msg)
        return True

    def on_finished(self, rid: str) -> None:
        """A request finished (its last output arrived)."""

    def replica_of(self, rid: str) -> int | None:
        return 0
