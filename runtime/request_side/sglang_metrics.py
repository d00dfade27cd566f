"""Prometheus series under SGLang's names (`sglang:*`, SGLang's labels and buckets), in the API
process beside our `radixgen_*` ones, so SGLang's dashboards and alerts read this server unchanged.

Request series are fed by `ServerMetrics`' hooks as outputs arrive; engine gauges are built from
the scheduler's `internal_state()` when Prometheus scrapes. Counts follow SGLang's meaning: token
and request counters move when a request finishes, labelled by whether it streamed; the
inter-token histogram counts tokens (an output of n tokens adds n at its per-token latency).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from radixgen.internal_state import InternalState, SchedulerState, StateValue
from radixgen.runtime.request_side.req_state import ReqState

P = "sglang:"
REQUEST_LABELS = ("model_name", "engine_type")
ENGINE_LABELS = (*REQUEST_LABELS, "tp_rank", "pp_rank", "moe_ep_rank")
ENGINE_TYPE = "unified"  # SGLang's value when prefill and decode run in one server

# SGLang's default buckets, so its dashboards' quantiles read the same
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
TOKEN_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
    12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000,
    200000, 300000, 400000, 600000, 800000, 1000000, 1100000,
)  # fmt: skip

# scheduler internal_state() key -> (SGLang gauge, help)
_ENGINE_GAUGES = {
    "running_requests": ("num_running_reqs", "The number of running requests."),
    "queue_requests": ("num_queue_reqs", "The number of requests in the waiting queue."),
    "grammar_waiting_requests": (
        "num_grammar_queue_reqs",
        "The number of requests waiting for their grammar to compile.",
    ),
    "kv_usage": ("token_usage", "The token usage (share of the KV pool in use)."),
    "kv_used_tokens": ("num_used_tokens", "The number of used tokens."),
    "cache_hit_rate": ("cache_hit_rate", "The prefix cache hit rate."),
    "max_total_num_tokens": ("max_total_num_tokens", "Maximum total tokens in the KV pool."),
    "kv_available_tokens": ("kv_available_tokens", "Free KV pool slots."),
    "cache_evictable_tokens": ("kv_evictable_tokens", "Cached tokens that could be evicted."),
    "new_token_ratio": ("new_token_ratio", "The scheduler's new-token reservation ratio."),
    "gen_throughput": ("gen_throughput", "Generated tokens per second since the last scrape."),
    "context_len": ("context_len", "The model's context length."),
    "page_size": ("page_size", "Tokens per KV page."),
}


class _TokenWeightedHistogram:
    """A histogram that takes n observations of one value in O(log buckets), as SGLang counts
    inter-token latency per token (prometheus_client's Histogram observes one at a time)."""

    def __init__(self, name: str, doc: str, buckets: Sequence[float]) -> None:
        self.name, self.doc = name, doc
        self.bounds = [*buckets, float("inf")]
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def observe(self, labels: tuple[str, ...], value: float, n: int) -> None:
        with self._lock:
            counts = self.counts.setdefault(labels, [0] * len(self.bounds))
            counts[bisect.bisect_left(self.bounds, value)] += n
            self.sums[labels] = self.sums.get(labels, 0.0) + value * n

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.doc, labels=REQUEST_LABELS)
        with self._lock:
            for labels, counts in self.counts.items():
                running, buckets = 0, []
                for bound, c in zip(self.bounds, counts, strict=True):
                    running += c
                    buckets.append(("+Inf" if bound == float("inf") else str(bound), running))
                family.add_metric(list(labels), buckets, self.sums[labels])
        return family


class SGLangMetrics(Collector):
    """Owns the `sglang:` series in the given registry; `ServerMetrics` calls the hooks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.model_name = ""
        self.context_len: int | None = None
        self.page_size: int | None = None
        self.snapshot: dict[str, StateValue | None] = {}  # None: a figure not known yet
        self._last_generated: tuple[float, float] | None = None  # (time, generated tokens)
        r, req, stream = registry, REQUEST_LABELS, (*REQUEST_LABELS, "is_streaming")
        self.prompt_tokens = Counter(
            P + "prompt_tokens", "Number of prefill tokens processed.", stream, registry=r
        )
        self.generation_tokens = Counter(
            P + "generation_tokens", "Number of generation tokens processed.", stream, registry=r
        )
        self.requests = Counter(
            P + "num_requests", "Number of requests processed.", stream, registry=r
        )
        self.cached_tokens = Counter(
            P + "cached_tokens",
            "Number of cached prompt tokens by source.",
            (*req, "cache_source"),
            registry=r,
        )
        self.so_requests = Counter(
            P + "num_so_requests", "Number of structured output requests processed.", req,
            registry=r,
        )  # fmt: skip
        self.aborted = Counter(
            P + "num_aborted_requests", "Number of requests aborted.", req, registry=r
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            stream, buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            P + "request_time_per_output_token_seconds",
            "Per-request time per output token in seconds (after the first).",
            stream, buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds",
            stream, buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_len = Histogram(
            P + "prompt_tokens_histogram", "Histogram of prompt token length.", req,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.uncached_len = Histogram(
            P + "uncached_prompt_tokens_histogram",
            "Histogram of uncached (computed) prompt token length.", req,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.generation_len = Histogram(
            P + "generation_tokens_histogram", "Histogram of generation token length.", req,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = _TokenWeightedHistogram(
            P + "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        r.register(self)

    def _labels(self) -> tuple[str, str]:
        return (self.model_name, ENGINE_TYPE)

    # --- hooks ------------------------------------------------------------------------------

    def on_first_token(self, stream: bool, ttft: float) -> None:
        self.ttft.labels(*self._labels(), _flag(stream)).observe(ttft)

    def on_tokens(self, per_token_latency: float, n: int) -> None:
        self.itl.observe(self._labels(), per_token_latency, n)

    def on_finish(self, st: ReqState, e2e: float, ttft: float | None) -> None:
        """One finished request: `st` is the TokenizerManager's ReqState."""
        labels, completion = self._labels(), len(st.output_ids)
        stream_labels = (*labels, _flag(st.stream))
        meta = st.meta
        cached = meta.cached_tokens if meta is not None else 0
        host = meta.host_cached_tokens if meta is not None else 0
        storage = meta.storage_cached_tokens if meta is not None else 0
        self.prompt_tokens.labels(*stream_labels).inc(st.prompt_tokens)
        self.generation_tokens.labels(*stream_labels).inc(completion)
        self.requests.labels(*stream_labels).inc()
        for source, n in (
            ("device", cached - host - storage),
            ("host", host),
            ("storage", storage),
        ):
            if n:
                self.cached_tokens.labels(*labels, source).inc(n)
        if st.constrained:
            self.so_requests.labels(*labels).inc()
        if st.finish_reason is not None and st.finish_reason.is_abort:
            self.aborted.labels(*labels).inc()
        self.e2e.labels(*stream_labels).observe(e2e)
        if ttft is not None and completion > 1:
            self.tpot.labels(*stream_labels).observe(max(0.0, e2e - ttft) / (completion - 1))
        self.prompt_len.labels(*labels).observe(st.prompt_tokens)
        self.uncached_len.labels(*labels).observe(st.prompt_tokens - cached)
        self.generation_len.labels(*labels).observe(completion)

    # --- scrape -------------------------------------------------------------------------------

    def update_engine_state(self, state: InternalState) -> None:
        """A fresh `internal_state()`: derive SGLang's gauges from it."""
        now = time.monotonic()
        derived: dict[str, StateValue | None] = {**state.as_dict()}
        if isinstance(state, SchedulerState):
            queues, kv = state.queues, state.kv_pool
            derived["queue_requests"] = queues.waiting_requests - queues.grammar_waiting_requests
            derived["kv_available_tokens"] = kv.max_total_num_tokens - kv.kv_used_tokens
            generated = float(state.counters.generated_tokens)
        else:  # an embedding server: no grammar queue, no KV pool, nothing generated
            derived["queue_requests"] = state.waiting_requests
            generated = 0.0
        last = self._last_generated
        derived["gen_throughput"] = (
            (generated - last[1]) / (now - last[0]) if last and now > last[0] else 0.0
        )
        self._last_generated = (now, generated)
        derived["context_len"], derived["page_size"] = self.context_len, self.page_size
        self.snapshot = derived

    def collect(self) -> Iterator[Metric]:
        values = [*self._labels(), "0", "0", "0"]
        for key, (name, doc) in _ENGINE_GAUGES.items():
            value = self.snapshot.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            gauge = GaugeMetricFamily(P + name, doc, labels=ENGINE_LABELS)
            gauge.add_metric(values, float(value))
            yield gauge
        retractions = self.snapshot.get("retractions")
        if isinstance(retractions, int):
            counter = CounterMetricFamily(
                P + "num_retracted_requests", "Total retracted requests.", labels=ENGINE_LABELS
            )
            counter.add_metric(values, float(retractions))
            yield counter
        yield self.itl.family()


def _flag(value: bool) -> str:
    return "true" if value else "false"
