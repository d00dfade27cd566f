"""The data-parallel router (API process): `DataParallelController` sends each request to one of
`--dp-size N` scheduler replicas.

It holds one PUSH socket per replica, routes each request with a `LoadBalancer`
(`load_balance.py`), remembers which replica runs which rid (so an abort reaches it) and counts
each replica's requests in flight (the loads the policies balance). Control messages go to every
replica (`SchedulerLink.control`).

NOTE: SGLang runs its DP controller as a process of its own between the tokenizer manager and the
schedulers. Here it lives in the API process instead: the TokenizerManager already sees every
dispatch and every finish, so loads are exact without load reports from the replicas, routing
adds no ZMQ hop, and a 2-core machine runs one process fewer. Outputs never pass through it:
every replica sends to the one detokenizer, as a single scheduler does.
"""

from __future__ import annotations

from typing import Any

import zmq
import zmq.asyncio

from radixgen.io_struct import AbortReq, TokenizedEmbeddingReq, TokenizedGenerateReq
from radixgen.runtime.request_side.load_balance import CacheAwareConfig, LoadBalancer
from radixgen.runtime.request_side.scheduler_client import SchedulerLink


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
        self._endpoints = list(endpoints)
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
        self._ring(rank, msg)
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
