"""Tensor-parallel ranks: the gloo group and its collectives, each with a timeout.

Runs in every scheduler rank process. `TensorParallelGroup` wraps `torch.distributed` so that every collective either completes or
raises `CollectiveError` within the group's timeout: a dead peer fails the next collective at
once, a live peer that is out of step fails it at the timeout, never a 30-minute gloo hang.
"""

from __future__ import annotations

import logging
import pickle
import time
from datetime import timedelta
from typing import Any

import torch

logger = logging.getLogger(__name__)


class CollectiveError(BaseException):
    """A collective failed or timed out: the ranks are out of step, and this rank must stop.

    NOTE: a BaseException so that the scheduler's per-request containment (`except Exception`)
    never swallows it: after a broken collective no later one can line up again.
    """


START_TIMEOUT_S = 600.0  # the launcher's own start-up limit


def _make_store(init_method: str, rank: int, size: int, timeout: timedelta) -> Any:
    """The rendezvous store: a file (one machine) or TCP, hosted by rank 0 (several)."""
    import torch.distributed as dist

    if init_method.startswith("file://"):
        store = dist.FileStore(init_method[len("file://") :], size)  # type: ignore[attr-defined]
        store.set_timeout(timeout)
        return store
    assert init_method.startswith("tcp://"), init_method
    host, _, port = init_method[len("tcp://") :].rpartition(":")
    return dist.TCPStore(host, int(port), size, is_master=rank == 0, timeout=timeout)  # type: ignore[attr-defined]


class TensorParallelGroup:
    """This process's rank in the tensor-parallel world (gloo) and the collectives it uses."""

    def __init__(self, rank: int, size: int, init_method: str, timeout_s: float) -> None:
        import torch.distributed as dist

        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self._dist = dist
        timeout = timedelta(seconds=timeout_s)
        try:
            self._store = _make_store(init_method, rank, size, timeout)
            dist.init_process_group(
                "gloo", store=self._store, rank=rank, world_size=size, timeout=timeout
            )
        except Exception as e:  # DistStoreError after the timeout when a rank never came
            raise CollectiveError(f"rank {rank}/{size}: joining {init_method} failed: {e}") from e
        # NOTE: cumulative seconds inside collectives, for the benchmark's communication share
        self.comm_seconds = 0.0

    # --- start-up: through the store, with the launcher's patience ----------------------------
    # NOTE: ranks reach these points after different amounts of work (rank 0 also starts the
    # grammar backend, ranks load at different speeds), so they wait up to START_TIMEOUT_S (the
    # launcher stops everything sooner if a rank dies) instead of --dist-timeout.

    def _gather_at_start(self, key: str, value: str) -> list[str]:
        self._store.set(f"{key}/{self.rank}", value)
        keys = [f"{key}/{r}" for r in range(self.size)]
        try:
            self._store.wait(keys, timedelta(seconds=START_TIMEOUT_S))
        except Exception as e:
            raise CollectiveError(f"rank {self.rank}/{self.size}: start-up {key}: {e}") from e
        return [self._store.get(k).decode() for k in keys]

    def startup_min(self, key: str, value: int) -> int:
        """The smallest of every rank's `value` (e.g. the KV slots each rank's memory allows)."""
        return min(int(v) for v in self._gather_at_start(key, str(value)))

    def startup_barrier(self) -> None:
        """Every rank is about to enter its step loop: from here on --dist-timeout applies."""
        self._gather_at_start("loop", "1")

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def _run(self, what: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            out = fn(*args)
        except Exception as e:  # gloo: "Connection closed by peer", "Timed out waiting ..."
            raise CollectiveError(
                f"tensor-parallel rank {self.rank}/{self.size}: {what} failed ({e}); a peer "
                f"rank died or is out of step (--dist-timeout {self.timeout_s:g} s)"
            ) from e
        self.comm_seconds += time.perf_counter() - t0
        return out

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place."""
        self._run("all_reduce", self._dist.all_reduce, t)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor (all of one shape), in rank order, on every rank."""
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self._run("all_gather", self._dist.all_gather, parts, t.contiguous())
        return parts

    def gather_columns(self, t: torch.Tensor) -> torch.Tensor | None:
        """Every rank's [M, C] block side by side on rank 0 ([M, C * size]); None elsewhere."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)] if self.is_first else None
        self._run("gather", self._dist.gather, t, parts, 0)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def broadcast_obj(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank: a size broadcast, then the pickled bytes."""
        if self.is_first:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=5)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        self._run("broadcast", self._dist.broadcast, size, 0)
        if not self.is_first:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._run("broadcast", self._dist.broadcast, payload, 0)
        return obj if self.is_first else pickle.loads(payload.numpy().tobytes())

    def close(self) -> None:
        try:
            self._dist.destroy_process_group()
        except Exception:  # already broken: nothing to tear down
            pass
