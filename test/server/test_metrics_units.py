"""`ServerMetrics` on its own (no server): the `sglang:` series it derives from request outputs and
from a scheduler `internal_state()` snapshot, beside our `radixgen_` ones."""

from __future__ import annotations

import dataclasses
import time

from prometheus_client.parser import text_string_to_metric_families

from radixgen.finish_reason import FinishReason
from radixgen.internal_state import (
    InternalState,
    KVPoolState,
    PrefixCacheState,
    QueueState,
    SchedulerCounters,
    SchedulerState,
    StepState,
)
from radixgen.io_struct import RequestMeta
from radixgen.runtime.request_side.metrics import ServerMetrics
from radixgen.runtime.request_side.tokenizer_manager import ReqState


def samples(metrics: ServerMetrics, state: InternalState | None = None) -> dict[str, float]:
    """name{sorted labels} -> value, labels dropped when they are only SGLang's fixed ones."""
    out = {}
    text = metrics.render(state, set()).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            extra = {k: v for k, v in s.labels.items() if k in ("is_streaming", "cache_source")}
            key = s.name + "".join(f"[{k}={v}]" for k, v in sorted(extra.items()))
            out[key] = out.get(key, 0.0) + s.value
    return out


def request(rid: str, stream: bool, constrained: bool = False) -> ReqState:
    return ReqState(
        rid=rid, prompt_tokens=5, return_logprob=False, top_logprobs_num=0, return_text=False,
        created=time.perf_counter() - 1.0, stream=stream, constrained=constrained,
    )  # fmt: skip


def finish(st: ReqState, cached: int = 0, first_token_delay: float | None = None) -> None:
    st.finish_reason = FinishReason.length(len(st.output_ids))
    st.meta = RequestMeta(
        prompt_tokens=st.prompt_tokens, completion_tokens=len(st.output_ids), cached_tokens=cached,
        first_token_delay=first_token_delay,
    )  # fmt: skip


def test_streamed_outputs_count_inter_token_latency_per_token():
    m = ServerMetrics("smol")
    st = request("a", stream=True)
    now = time.perf_counter()
    st.output_ids = [1, 2]  # the first output carries two tokens
    m.on_output(st, 2, now - 0.5)
    st.output_ids += [3, 4, 5]
    m.on_output(st, 3, now - 0.2)
    st.output_ids += [6]
    finish(st, cached=2)
    m.on_output(st, 1, now)
    s = samples(m)
    assert s["sglang:inter_token_latency_seconds_count"] == 4  # the tokens after the first output
    assert abs(s["sglang:inter_token_latency_seconds_sum"] - 0.5) < 1e-6  # 0.3 s + 0.2 s
    assert s["radixgen_inter_token_latency_seconds_count"] == 2  # ours: one per output
    assert s["sglang:num_requests_total[is_streaming=true]"] == 1
    assert s["sglang:generation_tokens_total[is_streaming=true]"] == 6
    assert s["sglang:prompt_tokens_total[is_streaming=true]"] == 5
    assert s["sglang:cached_tokens_total[cache_source=device]"] == 2
    assert abs(s["sglang:time_to_first_token_seconds_sum[is_streaming=true]"] - 0.5) < 0.05
    # time per output token: (e2e - ttft) / (tokens - 1)
    tpot = s["sglang:request_time_per_output_token_seconds_sum[is_streaming=true]"]
    assert abs(tpot - (1.0 - 0.5) / 5) < 0.05


def test_a_request_answered_at_once_uses_the_schedulers_first_token_time():
    m = ServerMetrics("smol")
    st = request("b", stream=False, constrained=True)
    st.output_ids = [1, 2, 3, 4]
    finish(st, first_token_delay=0.4)
    m.on_output(st, 4, time.perf_counter())
    s = samples(m)
    assert s["sglang:time_to_first_token_seconds_count[is_streaming=false]"] == 1
    assert abs(s["sglang:time_to_first_token_seconds_sum[is_streaming=false]"] - 0.4) < 1e-9
    assert s["sglang:inter_token_latency_seconds_count"] == 3
    assert s["sglang:num_so_requests_total"] == 1
    assert s.get("sglang:num_aborted_requests_total", 0) == 0


def test_aborted_requests_are_counted():
    m = ServerMetrics("smol")
    st = request("c", stream=True)
    st.finish_reason = FinishReason.abort("aborted by the client", 499)
    m.on_output(st, 0, time.perf_counter())
    s = samples(m)
    assert s["sglang:num_aborted_requests_total"] == 1
    assert s["sglang:num_requests_total[is_streaming=true]"] == 1


def test_engine_gauges_come_from_the_scheduler_snapshot():
    m = ServerMetrics()
    m.set_model("smol", context_len=2048, page_size=1)
    state = SchedulerState(
        queues=QueueState(running_requests=3, waiting_requests=5, grammar_waiting_requests=2),
        kv_pool=KVPoolState(max_total_num_tokens=400, kv_cache_dtype="bf16",
                            kv_bytes_per_token=64, kv_used_tokens=100),
        prefix_cache=PrefixCacheState(cache_evictable_tokens=40, cache_protected_tokens=0),
        steps=StepState(forward_steps=9, new_token_ratio=0.7),
        counters=SchedulerCounters(prompt_tokens=8, cached_tokens=4, generated_tokens=1000,
                                   retractions=7),
    )  # fmt: skip
    assert state.kv_pool.kv_usage == 0.25 and state.cache_hit_rate == 0.5
    s = samples(m, state)
    assert s["sglang:num_running_reqs"] == 3
    assert s["sglang:num_queue_reqs"] == 3 and s["sglang:num_grammar_queue_reqs"] == 2
    assert s["sglang:token_usage"] == 0.25 and s["sglang:cache_hit_rate"] == 0.5
    assert s["sglang:num_used_tokens"] == 100 and s["sglang:kv_available_tokens"] == 300
    assert s["sglang:max_total_num_tokens"] == 400 and s["sglang:kv_evictable_tokens"] == 40
    assert s["sglang:context_len"] == 2048 and s["sglang:page_size"] == 1
    assert s["sglang:num_retracted_requests_total"] == 7
    assert s["sglang:gen_throughput"] == 0  # no earlier scrape to measure from
    time.sleep(0.05)
    later = dataclasses.replace(state.counters, generated_tokens=1100)
    s = samples(m, dataclasses.replace(state, counters=later))
    assert 0 < s["sglang:gen_throughput"] <= 100 / 0.05
    assert s["radixgen_num_running_reqs"] == 3  # ours stay
