"""The TokenizerManager's link to the scheduler(s) (API process): one, or N data-parallel replicas.

`SchedulerLink` is the plain `--dp-size 1` path: one PUSH socket, every message sent as is.
`DataParallelController` (`--dp-size N`) holds one PUSH socket per replica, routes each request
with a `LoadBalancer`, remembers which replica runs which rid (so an abort reaches it) and counts
each replica's requests in flight (the loads the policies balance). Control messages go to every
replica; the TokenizerManager merges their internal states (`summed_internal_state`).

NOTE: SGLang runs its DP controller as a process of its own between the tokenizer manager and the
schedulers. Here it lives in the API process instead: the TokenizerManager already sees every
dispatch and every finish, so loads are exact without load reports from the replicas, routing
adds no ZMQ hop, and a 2-core machine runs one process fewer. Outputs never pass through it:
every replica sends to the one detokenizer, as a single scheduler does.
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
from radixgen.runtime.dp_controller.load_balance import CacheAwareConfig, LoadBalancer


class SchedulerLink:
    """One scheduler: sends everything to it (today's path, unchanged by data parallelism)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self._socks = [ctx.socket(zmq.PUSH)]
        self._socks[0].connect(endpoint)
        self._waiters: dict[str, asyncio.Future[ControlReply]] = {}  # replies by request_id

    @property
    def num_replicas(self) -> int:
        return len(self._socks)

    async def send_request(
        self, msg: TokenizedGenerateReq | TokenizedEmbeddingReq, rank: int | None = None
    ) -> int:
        """Send a request (to replica `rank` if given, else where the policy says); its rank."""
        await self._socks[0].send_pyobj(msg)
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


class DataParallelController(SchedulerLink):
    """N scheduler replicas behind one policy (see the module docstring for why in-process)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoints: list[str],
        method: str,
        config: CacheAwareConfig | None = None,
    ) -> None:
        super().__init__(ctx, endpoints[0])
        for endpoint in endpoints[1:]:
            sock = ctx.socket(zmq.PUSH)
            sock.connect(endpoint)
            self._socks.append(sock)
        self.balancer = LoadBalancer(method, len(endpoints), config)
        self.loads = [0] * len(endpoints)
        self.dispatched = [0] * len(endpoints)  # requests sent to each replica since start
        self._rank_of: dict[str, int] = {}

    async def send_request(
        self, msg: TokenizedGenerateReq | TokenizedEmbeddingReq, rank: int | None = None
    ) -> int:
        if rank is None:
            rank = self.balancer.choose(msg.input_ids, self.loads)
        elif self.balancer.method == "cache_aware":
            self.balancer.trees[rank].insert(msg.input_ids)
        self._rank_of[msg.rid] = rank
        self.loads[rank] += 1
        self.dispatched[rank] += 1
        await self._socks[rank].send_pyobj(msg)
        return rank

    def send_abort(self, msg: AbortReq) -> Any:
        rank = None if msg.abort_all else self._rank_of.get(msg.rid)
        if rank is not None:
            return self._socks[rank].send_pyobj(msg)
        # abort_all, or a rid not dispatched (yet): every replica (an unknown rid is ignored)
        futures = [sock.send_pyobj(msg) for sock in self._socks]
        return futures[-1]

    def on_finished(self, rid: str) -> None:
        rank = self._rank_of.pop(rid, None)
        if rank is not None:
            self.loads[rank] -= 1

    def replica_of(self, rid: str) -> int | None:
        return self._rank_of.get(rid)
