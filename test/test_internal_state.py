"""A scheduler's typed internal state (`radixgen.internal_state`): the flat view /server_info and
the metrics show (keys, order, derived ratios), the merge over data-parallel replicas, and the
pickling it travels by. Model-free and fast."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from radixgen.internal_state import (
    CacheTierState,
    EmbeddingSchedulerState,
    GrammarStats,
    HostTierState,
    KVPoolState,
    PrefixCacheState,
    QueueState,
    SchedulerCounters,
    SchedulerState,
    SpeculationState,
    StepState,
    StorageTierState,
    summed_internal_state,
)

# the flat view's keys in order, with HiCache's two tiers and a grammar manager: the keys and
# order the scheduler's state had as a dict (Scheduler.internal_state before it was typed)
FULL_KEYS = [
    "running_requests", "waiting_requests", "grammar_waiting_requests",
    "max_total_num_tokens", "kv_cache_dtype", "kv_bytes_per_token", "kv_used_tokens", "kv_usage",
    "cache_evictable_tokens", "cache_protected_tokens", "cache_hit_rate",
    "forward_steps", "new_token_ratio", "tp_comm_seconds", "dp_attention_idle_forwards",
    "prompt_tokens", "cached_tokens", "host_cached_tokens", "storage_cached_tokens",
    "generated_tokens", "retractions", "evicted_tokens", "jump_forward_tokens", "cut_steps",
    "step_seconds", "forward_seconds", "device_wait_seconds",
    "host_capacity_tokens", "host_used_tokens", "host_pinned_tokens", "host_block_tokens",
    "host_stored_blocks", "host_evicted_blocks", "host_hit_blocks", "host_hit_tokens",
    "storage_capacity_bytes", "storage_used_bytes", "storage_blocks", "storage_stored_blocks",
    "storage_evicted_blocks", "storage_hit_blocks", "storage_hit_tokens", "storage_bad_entries",
    "spec_verify_steps", "spec_verified_requests", "spec_draft_tokens", "spec_accepted_tokens",
    "spec_branch_tokens", "spec_branch_accepted_tokens", "spec_skipped_steps",
    "spec_accept_length", "spec_accept_rate",
    "grammar_compiles", "grammar_compile_seconds_total", "grammar_compile_seconds_max",
    "grammar_compile_queue_seconds_max", "grammar_compile_timeouts",
    "grammar_compile_worker_starts", "grammar_compile_worker_start_seconds_max",
    "grammar_compile_worker_kills", "grammar_compile_worker_crashes",
    "grammar_compile_errors", "grammar_compile_workers_alive", "grammar_compile_queued",
    "grammar_cache_hits", "grammar_cache_misses", "grammar_cache_entries", "grammar_cache_bytes",
    "grammar_cache_evictions", "grammar_waiting_compiles", "grammar_backends_built",
    "grammar_compile_failures", "grammar_backend_fallbacks", "grammar_backend_compile_fallbacks",
    "grammar_rejected_tokens", "mask_fill_calls", "mask_fill_rows",
    "mask_fill_rows_unrestricted", "mask_fill_seconds_total", "jump_forward_calls",
    "jump_forward_retokenized_tokens", "jump_forward_tail_tokens_left",
    "jump_forward_seconds_total",
]  # fmt: skip


def state(
    running: int = 1,
    used: int = 50,
    prompt: int = 10,
    cached: int = 0,
    ratio: float = 0.4,
    tiers: CacheTierState | None = None,
    speculation: SpeculationState | None = None,
    grammar: GrammarStats | None = None,
) -> SchedulerState:
    return SchedulerState(
        queues=QueueState(running, 2, 1),
        kv_pool=KVPoolState(100, "bf16", 64, used),
        prefix_cache=PrefixCacheState(5, 6),
        steps=StepState(7, ratio, 0.5, 0),
        counters=SchedulerCounters(prompt_tokens=prompt, cached_tokens=cached, generated_tokens=3),
        tiers=tiers or CacheTierState(),
        speculation=speculation or SpeculationState(),
        grammar=grammar,
    )


def full_state() -> SchedulerState:
    return state(
        tiers=CacheTierState(HostTierState(256, 64, 0, 16, 4), StorageTierState(1 << 20, 4096, 3)),
        speculation=SpeculationState(
            spec_verified_requests=4, spec_draft_tokens=8, spec_accepted_tokens=6
        ),
        grammar=GrammarStats(grammar_compiles=2.0, jump_forward_tokens=9),
    )


def test_the_flat_view_has_the_keys_and_order_it_always_had():
    view = full_state().as_dict()
    assert list(view) == FULL_KEYS
    assert view["kv_usage"] == 0.5 and view["cache_hit_rate"] == 0.0
    assert view["spec_accept_length"] == (6 + 4) / 4 and view["spec_accept_rate"] == 6 / 8
    assert view["kv_cache_dtype"] == "bf16" and view["grammar_compiles"] == 2.0
    # the grammar's jump-forward count stands in the counters' place, as the dict had it
    assert view["jump_forward_tokens"] == 9
    plain = state().as_dict()  # no tiers, no grammar manager: their keys are absent
    assert "host_used_tokens" not in plain and "grammar_compiles" not in plain
    assert plain["jump_forward_tokens"] == 0 and "dp_size" not in plain


def test_replicas_sum_counts_and_recompute_ratios():
    one = state()
    two = state(running=2, used=0, prompt=30, cached=20, ratio=0.2)
    assert summed_internal_state([one]) is one
    agg = summed_internal_state([one, two])
    assert isinstance(agg, SchedulerState)
    view = agg.as_dict()
    assert view["running_requests"] == 3 and view["max_total_num_tokens"] == 200
    assert view["kv_usage"] == 50 / 200 and view["cache_hit_rate"] == 20 / 40
    assert view["new_token_ratio"] == pytest.approx(0.3) and view["kv_cache_dtype"] == "bf16"
    assert view["dp_size"] == 2 and list(view) == [*list(one.as_dict()), "dp_size"]


def test_replicas_keep_settings_once_maxima_the_largest_and_derived_ratios_follow_the_sums():
    one = full_state()
    two = dataclasses.replace(
        one,
        speculation=SpeculationState(spec_verified_requests=1, spec_draft_tokens=2),
        grammar=GrammarStats(grammar_compiles=1.0, grammar_compile_seconds_max=3.0),
    )
    view = SchedulerState.summed([one, two]).as_dict()
    assert view["kv_bytes_per_token"] == 64 and view["host_block_tokens"] == 16
    assert view["host_capacity_tokens"] == 512 and view["storage_blocks"] == 6
    assert view["grammar_compiles"] == 3.0 and view["grammar_compile_seconds_max"] == 3.0
    assert view["spec_accept_length"] == (6 + 5) / 5 and view["spec_accept_rate"] == 6 / 10
    three = SchedulerState.summed([SchedulerState.summed([one, two]), one])
    assert three.dp_size == 3 and three.queues.running_requests == 3


def test_embedding_server_state():
    one = EmbeddingSchedulerState(2, 5, 9, 40, embedding_dim=384, max_input_tokens=512)
    assert one.as_dict() == {
        "running_requests": 0, "waiting_requests": 2, "forward_steps": 5,
        "embedded_requests": 9, "prompt_tokens": 40, "cached_tokens": 0,
        "embedding_dim": 384, "max_input_tokens": 512,
    }  # fmt: skip
    agg = summed_internal_state([one, one])
    assert isinstance(agg, EmbeddingSchedulerState)
    assert agg.as_dict() == {**one.as_dict(), "waiting_requests": 4, "forward_steps": 10,
                             "embedded_requests": 18, "prompt_tokens": 80, "dp_size": 2}  # fmt: skip
    with pytest.raises(ValueError, match="mixed kinds"):
        summed_internal_state([one, state()])


def test_states_pickle_as_they_travel():
    for st in (full_state(), state(), EmbeddingSchedulerState(0, 0, 0, 0, 8, 8)):
        back = pickle.loads(pickle.dumps(st))
        assert back == st and back.as_dict() == st.as_dict()
