"""A scheduler's internal state, typed: the reply to `GetInternalStateReq` (every process; no torch).

A generating scheduler answers a `SchedulerState`, composed of typed parts (its request queues,
the KV pool, the prefix cache, its steps, its counters, the cache tiers below the KV pool, the
speculation counters and the grammar counters); an embedding server's scheduler answers an
`EmbeddingSchedulerState`. Both travel pickled, like the other messages of `io_struct.py`.

`as_dict()` is the flat JSON /server_info shows per replica and the metrics export: the same keys,
values and order the scheduler's state had when it was a dict of names. Ratios (`kv_usage`,
`cache_hit_rate`, `spec_accept_length`, `spec_accept_rate`) are derived from the counts, never
stored. `summed(states)` merges the replicas of `--dp-size` field by field: counts are added,
`*_max` figures take the largest, settings (a dtype, a block size) the first replica's and
`new_token_ratio` the mean; the ratios then follow from the sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, TypeAlias, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# one value of the flat view: a count, seconds, a ratio, or a setting's name
StateValue: TypeAlias = int | float | str
# the flat view by name (/server_info, the metrics, the dashboard's JSON)
StateDict: TypeAlias = dict[str, StateValue]

# how `summed` merges a field over the replicas (the default: added up)
_FIRST = {"merge": "first"}  # a setting: every replica has the same
_MAX = {"merge": "max"}  # the largest
_MEAN = {"merge": "mean"}

_R = TypeVar("_R", bound="DataclassInstance")


def _values(record: DataclassInstance) -> StateDict:
    """A flat record's fields by name, in declaration order."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _merged(records: Sequence[_R]) -> _R:
    """One flat record from the replicas' (see the module docstring for the rules)."""
    first = records[0]
    if len(records) == 1:
        return first
    merged: StateDict = {}
    for f in fields(first):
        column = [getattr(r, f.name) for r in records]
        how = f.metadata.get("merge", "sum")
        if how == "first":
            merged[f.name] = column[0]
        elif how == "max":
            merged[f.name] = max(column)
        elif how == "mean":
            merged[f.name] = sum(column) / len(column)
        else:
            merged[f.name] = sum(column)
    return type(first)(**merged)


def _merged_parts(parts: Sequence[_R | None]) -> _R | None:
    """An optional part merged over the replicas that have it (None if none has)."""
    present = [p for p in parts if p is not None]
    return _merged(present) if present else None


@dataclass(frozen=True, slots=True)
class QueueState:
    """The scheduler's requests now."""

    running_requests: int
    waiting_requests: int  # those waiting for their grammar's compile included
    grammar_waiting_requests: int


@dataclass(frozen=True, slots=True)
class KVPoolState:
    """The KV pool: its size and format, and the slots in use."""

    max_total_num_tokens: int
    kv_cache_dtype: str = field(metadata=_FIRST)
    kv_bytes_per_token: int = field(metadata=_FIRST)
    kv_used_tokens: int = 0

    @property
    def kv_usage(self) -> float:
        """Share of the pool in use (0..1)."""
        total = self.max_total_num_tokens
        return self.kv_used_tokens / total if total else 0.0


@dataclass(frozen=True, slots=True)
class PrefixCacheState:
    """KV slots the prefix cache holds: evictable, and protected by the requests using them."""

    cache_evictable_tokens: int
    cache_protected_tokens: int


@dataclass(frozen=True, slots=True)
class StepState:
    """The scheduler's steps: how many, its new-token reservation ratio, and parallel overheads."""

    forward_steps: int
    new_token_ratio: float = field(metadata=_MEAN)
    # time inside tensor-parallel collectives (rank 0's, waits for slower ranks included)
    tp_comm_seconds: float = 0.0
    dp_attention_idle_forwards: int = 0


@dataclass(slots=True)
class SchedulerCounters:
    """Counters since start. The scheduler counts into one (its `stats`); a `SchedulerState`
    holds a copy taken when it was built."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0  # of cached_tokens, copied back from the host tier (HiCache)
    storage_cached_tokens: int = 0  # of cached_tokens, read back from the file tier (HiCache)
    generated_tokens: int = 0
    retractions: int = 0
    evicted_tokens: int = 0
    jump_forward_tokens: int = 0
    cut_steps: int = 0  # all-background steps stopped for an interactive arrival
    # where the scheduler's time goes (seconds): whole steps, launching forwards (on CPU: the
    # forward itself), and waiting for the device's sampled tokens. Host work per step is
    # step - wait (a GPU), or step - forward (the CPU, where the forward runs inline).
    step_seconds: float = 0.0
    forward_seconds: float = 0.0
    device_wait_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class HostTierState:
    """HiCache's host tier: capacity and use (tokens), and its counters."""

    host_capacity_tokens: int
    host_used_tokens: int
    host_pinned_tokens: int
    host_block_tokens: int = field(metadata=_FIRST)
    host_stored_blocks: int = 0
    host_evicted_blocks: int = 0
    host_hit_blocks: int = 0
    host_hit_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StorageTierState:
    """HiCache's file tier: capacity and use (bytes), its blocks and counters."""

    storage_capacity_bytes: int
    storage_used_bytes: int
    storage_blocks: int
    storage_stored_blocks: int = 0
    storage_evicted_blocks: int = 0
    storage_hit_blocks: int = 0
    storage_hit_tokens: int = 0
    storage_bad_entries: int = 0


@dataclass(frozen=True, slots=True)
class CacheTierState:
    """The cache tiers below the KV pool (`BasePrefixCache.tier_state()`): none without
    HiCache, the host tier with it, and the file tier when one is configured."""

    host: HostTierState | None = None
    storage: StorageTierState | None = None

    def as_dict(self) -> StateDict:
        out: StateDict = {}
        if self.host is not None:
            out.update(_values(self.host))
        if self.storage is not None:
            out.update(_values(self.storage))
        return out

    @classmethod
    def summed(cls, tiers: Sequence[CacheTierState]) -> CacheTierState:
        return cls(
            host=_merged_parts([t.host for t in tiers]),
            storage=_merged_parts([t.storage for t in tiers]),
        )


@dataclass(slots=True)
class SpeculationState:
    """Speculative decoding's counters since start: verified request-steps, draft tokens
    proposed and accepted (those on a branch off the tree's main chain apart too), steps that
    carried drafts, steps where drafting was switched off by size. The draft models count into
    one; a `SchedulerState` holds a copy."""

    spec_verify_steps: int = 0
    spec_verified_requests: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_branch_tokens: int = 0
    spec_branch_accepted_tokens: int = 0
    spec_skipped_steps: int = 0

    @property
    def spec_accept_length(self) -> float:
        """Tokens appended per verified request-step (accepted drafts + the bonus token)."""
        n = self.spec_verified_requests
        return (self.spec_accepted_tokens + n) / n if n else 0.0

    @property
    def spec_accept_rate(self) -> float:
        drafted = self.spec_draft_tokens
        return self.spec_accepted_tokens / drafted if drafted else 0.0

    def as_dict(self) -> StateDict:
        return {
            **_values(self),
            "spec_accept_length": self.spec_accept_length,
            "spec_accept_rate": self.spec_accept_rate,
        }


@dataclass(frozen=True, slots=True)
class GrammarStats:
    """The grammar manager's figures (`GrammarManager.stats()`): its compile pools' counters
    (summed over the backends built; `*_max` the largest), compile caches, and its own counters.

    The compile pools' counters are floats, counts among them: /server_info has always shown
    them so (`"grammar_compiles": 2.0`)."""

    # the compile pools' (`CompilePoolCounters`)
    grammar_compiles: float = 0.0
    grammar_compile_seconds_total: float = 0.0
    grammar_compile_seconds_max: float = field(default=0.0, metadata=_MAX)
    grammar_compile_queue_seconds_max: float = field(default=0.0, metadata=_MAX)
    grammar_compile_timeouts: float = 0.0
    grammar_compile_worker_starts: float = 0.0
    grammar_compile_worker_start_seconds_max: float = field(default=0.0, metadata=_MAX)
    grammar_compile_worker_kills: float = 0.0
    grammar_compile_worker_crashes: float = 0.0
    # compile pools and caches, now
    grammar_compile_errors: int = 0
    grammar_compile_workers_alive: int = 0
    grammar_compile_queued: int = 0
    grammar_cache_hits: int = 0
    grammar_cache_misses: int = 0
    grammar_cache_entries: int = 0
    grammar_cache_bytes: int = 0
    grammar_cache_evictions: int = 0
    grammar_waiting_compiles: int = 0
    grammar_backends_built: int = 0
    # the manager's own (`GrammarCounters`)
    grammar_compile_failures: int = 0
    grammar_backend_fallbacks: int = 0
    grammar_backend_compile_fallbacks: int = 0
    grammar_rejected_tokens: int = 0
    mask_fill_calls: int = 0
    mask_fill_rows: int = 0
    mask_fill_rows_unrestricted: int = 0
    mask_fill_seconds_total: float = 0.0
    jump_forward_calls: int = 0
    jump_forward_tokens: int = 0
    jump_forward_retokenized_tokens: int = 0
    jump_forward_tail_tokens_left: int = 0
    jump_forward_seconds_total: float = 0.0

    def as_dict(self) -> StateDict:
        return _values(self)


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """A generating scheduler's state (`Scheduler.internal_state()`)."""

    queues: QueueState
    kv_pool: KVPoolState
    prefix_cache: PrefixCacheState
    steps: StepState
    counters: SchedulerCounters
    tiers: CacheTierState = CacheTierState()
    speculation: SpeculationState = field(default_factory=SpeculationState)
    grammar: GrammarStats | None = None  # None: no grammar manager
    dp_size: int = 1  # replicas merged into this one (`summed`)

    @property
    def cache_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / all prompt tokens."""
        c = self.counters
        return c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0

    def as_dict(self) -> StateDict:
        out: StateDict = {
            **_values(self.queues),
            **_values(self.kv_pool),
            "kv_usage": self.kv_pool.kv_usage,
            **_values(self.prefix_cache),
            "cache_hit_rate": self.cache_hit_rate,
            **_values(self.steps),
            **_values(self.counters),
            **self.tiers.as_dict(),
            **self.speculation.as_dict(),
            # NOTE: the grammar's jump_forward_tokens replaces the counters' (same count) and
            # keeps their place, as the dict this view replaced did
            **(self.grammar.as_dict() if self.grammar is not None else {}),
        }
        if self.dp_size > 1:
            out["dp_size"] = self.dp_size
        return out

    @classmethod
    def summed(cls, states: Sequence[SchedulerState]) -> SchedulerState:
        """The engine's state over its replicas (a single replica's is returned as it is)."""
        if len(states) == 1:
            return states[0]
        return cls(
            queues=_merged([s.queues for s in states]),
            kv_pool=_merged([s.kv_pool for s in states]),
            prefix_cache=_merged([s.prefix_cache for s in states]),
            steps=_merged([s.steps for s in states]),
            counters=_merged([s.counters for s in states]),
            tiers=CacheTierState.summed([s.tiers for s in states]),
            speculation=_merged([s.speculation for s in states]),
            grammar=_merged_parts([s.grammar for s in states]),
            dp_size=sum(s.dp_size for s in states),
        )


@dataclass(frozen=True, slots=True)
class EmbeddingSchedulerState:
    """An embedding server's scheduler (`EmbeddingScheduler.internal_state()`): its queue,
    steps and counters, and the model's vector width and input limit. Nothing runs between
    steps, so `running_requests` stays 0; `cached_tokens` counts the prompt tokens a decoder
    embedder reused from its radix tree (0 for an encoder)."""

    waiting_requests: int
    forward_steps: int
    embedded_requests: int
    prompt_tokens: int
    embedding_dim: int = field(metadata=_FIRST)
    max_input_tokens: int = field(metadata=_FIRST)
    running_requests: int = 0
    cached_tokens: int = 0
    dp_size: int = 1  # replicas merged into this one (`summed`)

    def as_dict(self) -> StateDict:
        out: StateDict = {
            "running_requests": self.running_requests,
            "waiting_requests": self.waiting_requests,
            "forward_steps": self.forward_steps,
            "embedded_requests": self.embedded_requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "embedding_dim": self.embedding_dim,
            "max_input_tokens": self.max_input_tokens,
        }
        if self.dp_size > 1:
            out["dp_size"] = self.dp_size
        return out

    @classmethod
    def summed(cls, states: Sequence[EmbeddingSchedulerState]) -> EmbeddingSchedulerState:
        """The engine's state over its replicas (a single replica's is returned as it is)."""
        return _merged(states)


# what a scheduler answers GetInternalStateReq with
InternalState: TypeAlias = SchedulerState | EmbeddingSchedulerState


def summed_internal_state(states: Sequence[InternalState]) -> InternalState:
    """One state for the whole engine from its replicas' (`--dp-size`), in replica order."""
    generating = [s for s in states if isinstance(s, SchedulerState)]
    embedding = [s for s in states if isinstance(s, EmbeddingSchedulerState)]
    if generating and not embedding:
        return SchedulerState.summed(generating)
    if embedding and not generating:
        return EmbeddingSchedulerState.summed(embedding)
    raise ValueError(f"cannot merge the internal states of {len(states)} replicas of mixed kinds")
