"""The dashboard's data in the API process: one scheduler snapshot shared by every open page,
turned into the JSON the page and other tools read (`/dashboard/api/...`).

The scheduler sends token ids; their text previews are decoded here (off the event loop). Rates
(tokens per second) and the short history behind the plots are derived from successive snapshots,
so nothing is sampled while nobody looks.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Protocol

from radixgen.internal_state import SchedulerState
from radixgen.io_struct import DashboardSnapshot
from radixgen.runtime.dashboard.traces import ProgramTraceStore

HISTORY_POINTS = 300  # plot points kept (about five minutes at the page's 1 Hz)
SHARE_WINDOW_S = 0.25  # pages asking within this window share one scheduler snapshot
HOT_NODES = 5  # shared nodes marked hot in the tree
PAGE_TRACES = 20  # traced program runs listed in each view (the Programs panel)


class SnapshotSource(Protocol):
    """What the hub needs of the TokenizerManager."""

    program_traces: ProgramTraceStore

    async def dashboard_snapshot(self, max_nodes: int) -> DashboardSnapshot: ...


class Decoder(Protocol):
    def decode_batch(
        self, batch: list[list[int]], skip_special_tokens: bool = True
    ) -> list[str]: ...


@dataclass(frozen=True)
class HistoryPoint:
    time: float
    kv_usage: float
    cache_hit_rate: float
    running: int
    waiting: int
    retracted: int
    tokens_per_s: float


class DashboardHub:
    """Snapshots for the dashboard's routes, shared and rate-derived (one per API process)."""

    def __init__(self) -> None:
        self.history: deque[HistoryPoint] = deque(maxlen=HISTORY_POINTS)
        self._last: tuple[float, int] | None = None  # (time, generated_tokens) of the last one
        self._cached: tuple[float, int, dict[str, object]] | None = None
        self._lock = asyncio.Lock()

    async def snapshot(
        self, tm: SnapshotSource, tokenizer: Decoder, max_nodes: int
    ) -> dict[str, object]:
        """The page's view; a snapshot taken moments ago with the same cap is reused."""
        async with self._lock:
            now = time.monotonic()
            if self._cached is not None:
                at, nodes, view = self._cached
                if now - at < SHARE_WINDOW_S and nodes == max_nodes:
                    return view
            raw = await tm.dashboard_snapshot(max_nodes)
            view = await asyncio.to_thread(build_view, raw, tokenizer)
            self._add_history(raw)
            view["history"] = [p.__dict__ for p in self.history]
            view["traces"] = tm.program_traces.summaries(PAGE_TRACES)
            self._cached = (time.monotonic(), max_nodes, view)
            return view

    def _add_history(self, raw: DashboardSnapshot) -> None:
        st = raw.state
        if isinstance(st, SchedulerState):
            generated, kv_usage, hit_rate = (
                st.counters.generated_tokens,
                st.kv_pool.kv_usage,
                st.cache_hit_rate,
            )
            running, waiting = st.queues.running_requests, st.queues.waiting_requests
        else:  # an embedding server's: it generates nothing and keeps no KV
            generated, kv_usage, hit_rate = 0, 0.0, 0.0
            running, waiting = st.running_requests, st.waiting_requests
        t = raw.time
        rate = 0.0
        if self._last is not None and t > self._last[0]:
            rate = max(0, generated - self._last[1]) / (t - self._last[0])
        self._last = (t, generated)
        self.history.append(
            HistoryPoint(
                time=t,
                kv_usage=kv_usage,
                cache_hit_rate=hit_rate,
                running=running,
                waiting=waiting,
                retracted=raw.retracted_waiting,
                tokens_per_s=round(rate, 2),
            )
        )


def build_view(raw: DashboardSnapshot, tokenizer: Decoder) -> dict[str, object]:
    """The scheduler's snapshot as the page's JSON: token ids replaced by text, the hot nodes
    marked."""
    batch = [n.preview_ids for n in raw.tree_nodes]
    for r in raw.requests:
        batch += [r.prompt_head_ids, r.prompt_tail_ids, r.output_ids]
    texts = tokenizer.decode_batch(batch, skip_special_tokens=False) if batch else []
    it = iter(texts)
    shared = sorted((n for n in raw.tree_nodes if n.hits > 0), key=lambda n: (-n.hits, -n.tokens))
    hot = {n.id for n in shared[:HOT_NODES]}
    tree: list[dict[str, object]] = []
    for n in raw.tree_nodes:
        node = {k: v for k, v in asdict(n).items() if k != "preview_ids"}
        node["preview"] = next(it) + ("…" if n.preview_truncated else "")
        node["hot"] = n.id in hot
        tree.append(node)
    requests = []
    for r in raw.requests:
        head, tail, out = next(it), next(it), next(it)
        view = {k: v for k, v in asdict(r).items() if not k.endswith("_ids")}
        gap = f" …[{r.prompt_gap} tokens]… " if r.prompt_gap else ""
        view["prompt"] = head + gap + tail
        view["output"] = out + ("…" if r.output_truncated else "")
        requests.append(view)
    steps = [asdict(s) for s in raw.steps]
    return {
        "time": raw.time,
        "build_seconds": raw.build_seconds,
        "state": raw.state.as_dict(),
        "dp_size": raw.dp_size,
        "retracted_waiting": raw.retracted_waiting,
        "radix_enabled": raw.radix_enabled,
        "tree": {"nodes": tree, "truncated": raw.tree_truncated},
        "steps": steps,
        "batch": steps[-1] if steps else None,
        "requests": requests,
    }
