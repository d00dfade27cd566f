"""Prometheus metrics of the API process (`--enable-metrics`, served at `/metrics`).

Request-level figures (counts, tokens, TTFT / inter-token / end-to-end latency) are recorded by
the TokenizerManager's hooks as outputs arrive: O(1) work per output batch, nothing per token.
Engine-level figures (running / queued requests, KV usage, radix hit rate, grammar stats) are read
from the scheduler's `internal_state()` when Prometheus scrapes, so they cost nothing otherwise.
The same figures are also exported under SGLang's names (`sglang:*`, `sglang_metrics`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radixgen.internal_state import InternalState, StateDict
from radixgen.runtime.request_side.req_state import ReqState
from radixgen.runtime.request_side.sglang_metrics import SGLangMetrics

PREFIX = "radixgen_"
LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip

# internal_state() keys with a dedicated, documented metric; the rest are exported generically.
_NAMED_STATE = {
    "running_requests": ("num_running_reqs", "Requests in the running (decoding) batch."),
    "waiting_requests": (
        "num_queue_reqs",
        "Requests waiting for admission (incl. grammar compile).",
    ),
    "kv_usage": ("token_usage", "Share of the KV pool in use (0..1)."),
    "kv_used_tokens": ("kv_used_tokens", "KV pool slots in use."),
    "max_total_num_tokens": ("max_total_num_tokens", "KV pool size in tokens."),
    "cache_hit_rate": (
        "cache_hit_rate",
        "Prompt tokens served from the radix cache / all prompt tokens.",
    ),
}


class _EngineStateCollector(Collector):
    """Turns the latest scheduler snapshot into gauges at scrape time."""

    def __init__(self) -> None:
        self.snapshot: StateDict = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for key, value in self.snapshot.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name, doc = _NAMED_STATE.get(key, (_metric_name(key), f"Scheduler state '{key}'."))
            family = GaugeMetricFamily(PREFIX + name, doc)
            family.add_metric([], float(value))
            yield family


def _metric_name(key: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return name if name.startswith("grammar") else f"scheduler_{name}"


class ServerMetrics:
    """Owns a private registry; the TokenizerManager calls `on_submit` / `on_output`."""

    def __init__(self, served_model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "Finished requests by finish reason.",
            ["finish_reason"],
            registry=r,
        )
        self.received = Counter(PREFIX + "requests_received", "Requests submitted.", registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens.", registry=r)
        self.cached_tokens = Counter(
            PREFIX + "cached_tokens", "Prompt tokens served from the prefix cache.", registry=r
        )
        self.tier_cached_tokens = Counter(
            PREFIX + "hicache_cached_tokens",
            "Prompt tokens served from the prefix cache by tier (device: the KV pool; host, "
            "storage: HiCache's lower tiers).",
            ["tier"],
            registry=r,
        )
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Generated tokens.", registry=r
        )
        self.in_flight = Gauge(
            PREFIX + "api_requests_in_flight", "Requests the API process is waiting on.", registry=r
        )  # set at scrape time: aborted requests never report a finish here
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time to first token (streamed requests; non-streamed ones get one output at the end).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Time between streamed outputs, per token.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Submit-to-finish latency.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_state = _EngineStateCollector()
        r.register(self.engine_state)
        self.sglang = SGLangMetrics(r)
        self.sglang.model_name = served_model_name
        self._last_output: dict[str, float] = {}
        self._ttft: dict[str, float] = {}  # streamed requests in flight: their time to first token

    def set_model(self, served_model_name: str, context_len: int, page_size: int) -> None:
        """What the `sglang:` series label and report; known once the engine is up."""
        self.sglang.model_name = served_model_name
        self.sglang.context_len, self.sglang.page_size = context_len, page_size

    # --- hooks called by the TokenizerManager ----------------------------------------------------

    def on_submit(self, st: ReqState) -> None:
        self.received.inc()
        self.prompt_tokens.inc(st.prompt_tokens)

    def on_output(self, st: ReqState, new_tokens: int, now: float) -> None:
        ttft = self._ttft.get(st.rid)
        if new_tokens:
            last = self._last_output.get(st.rid)
            if last is None:
                ttft = self._observe_first_output(st, new_tokens, now)
            else:
                per_token = (now - last) / new_tokens
                self.itl.observe(per_token)
                self.sglang.on_tokens(per_token, new_tokens)
            self._last_output[st.rid] = now
            self.generation_tokens.inc(new_tokens)
        if not st.finished:
            if ttft is not None:
                self._ttft[st.rid] = ttft
            return
        self._last_output.pop(st.rid, None)
        self._ttft.pop(st.rid, None)
        self.e2e.observe(now - st.created)
        reason = st.finish_reason.kind if st.finish_reason else "unknown"
        self.requests.labels(finish_reason=reason).inc()
        if st.meta is not None:
            meta = st.meta
            self.cached_tokens.inc(meta.cached_tokens)
            lower = meta.host_cached_tokens + meta.storage_cached_tokens
            for tier, n in (
                ("device", meta.cached_tokens - lower),
                ("host", meta.host_cached_tokens),
                ("storage", meta.storage_cached_tokens),
            ):
                if n:
                    self.tier_cached_tokens.labels(tier=tier).inc(n)
        self.sglang.on_finish(st, now - st.created, ttft)

    def _observe_first_output(self, st: ReqState, new_tokens: int, now: float) -> float | None:
        """Time to first token (None if unknown); when every token came at once, also their
        inter-token latency."""
        if not (st.finished and new_tokens > 1):
            ttft: float = now - st.created
        else:  # not streamed: all tokens arrive at the finish; use the scheduler's clock
            delay = getattr(st.meta, "first_token_delay", None)
            if delay is None:
                return None
            ttft = float(delay)
            per_token = max(0.0, now - st.created - ttft) / (new_tokens - 1)
            self.itl.observe(per_token)
            self.sglang.on_tokens(per_token, new_tokens - 1)
        self.ttft.observe(ttft)
        self.sglang.on_first_token(st.stream, ttft)
        return ttft

    # --- scrape ---------------------------------------------------------------------------------

    def render(self, engine_state: InternalState | None, live_rids: set[str]) -> bytes:
        """Prometheus text format; `engine_state` is a fresh `internal_state()` (or None)."""
        self.in_flight.set(len(live_rids))
        # requests aborted by their client never report a finish: forget their timestamps
        self._last_output = {k: v for k, v in self._last_output.items() if k in live_rids}
        self._ttft = {k: v for k, v in self._ttft.items() if k in live_rids}
        if engine_state is not None:
            self.engine_state.snapshot = {**engine_state.as_dict(), "snapshot_time": time.time()}
            self.sglang.update_engine_state(engine_state)
        return generate_latest(self.registry)
