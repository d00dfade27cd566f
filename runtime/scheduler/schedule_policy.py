"""Waiting-queue order (scheduler process): priority levels first, then FCFS,
longest-prefix-match first, or radix-tree DFS order within a level; and which running request a
blocked higher-priority one may preempt.

A request's `rank` is (tier, priority key), smaller first: interactive requests (tier 0) before
Batch API lines (tier 1) always, then the user's priority when --enable-priority-scheduling is on
(0 for all otherwise). The queue is bucketed by rank in one pass (a server sees a handful of
distinct priorities), so priorities add no sort of the whole queue; FCFS's sort by arrival is
near-linear, the queue being appended in arrival order.

Cache-aware policies match every waiting request against the radix tree, so they only pay while
the queue is short; past `max_policy_queue` they fall back to FCFS.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixgen.runtime.mem_cache.radix_cache import RadixCache, TreeNode

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.scheduler.req import Req

MAX_POLICY_QUEUE = 256

Rank = tuple[int, int]  # (tier: 0 interactive, 1 background; priority key), smaller first


@dataclass(frozen=True)
class PreemptionPolicy:
    """When a blocked waiting request may retract a running one (from the scheduler flags)."""

    enabled: bool  # not --disable-priority-preemption
    by_priority: bool  # --enable-priority-scheduling: user priorities count, not only the tier
    threshold: int  # --priority-scheduling-preemption-threshold

    def victim(self, candidate: Req, running: Iterable[Req]) -> Req | None:
        if not self.enabled:
            return None
        return preemption_victim(candidate, running, self.threshold, self.by_priority)


def priority_rank(priority: int, background: bool, low_values_first: bool) -> Rank:
    """A request's rank: SGLang's direction (larger priority values first unless
    --schedule-low-priority-values-first), with Batch API lines below every interactive request."""
    return (int(background), priority if low_values_first else -priority)


def outranks(a: Rank, b: Rank, threshold: int, by_priority: bool) -> bool:
    """May a request of rank `a` preempt a running one of rank `b`? An interactive request always
    outranks a batch line (a batch has no latency target); within a tier only with priority
    scheduling on and a priority gap above the threshold (SGLang's rule: retraction costs the
    victim a re-prefill, worth paying only for a clearly more important request)."""
    if a[0] != b[0]:
        return a[0] < b[0]
    return by_priority and b[1] - a[1] > threshold


def preemption_victim(
    candidate: Req, running: Iterable[Req], threshold: int, by_priority: bool
) -> Req | None:
    """The running request to retract for `candidate`, or None: the lowest-ranked one it
    outranks, the newest among equals (the least work lost)."""
    victim: Req | None = None
    for r in running:
        if not outranks(candidate.rank, r.rank, threshold, by_priority):
            continue
        if victim is None or (r.rank, r.arrival_time) > (victim.rank, victim.arrival_time):
            victim = r
    return victim


def order_waiting_queue(
    queue: list[Req], policy: str, cache: BasePrefixCache, max_policy_queue: int = MAX_POLICY_QUEUE
) -> list[Req]:
    """Return the queue in admission order: by rank, then the policy within a rank (retracted
    requests first in each)."""
    fcfs = policy == "fcfs" or not isinstance(cache, RadixCache) or len(queue) > max_policy_queue
    levels: dict[Rank, list[Req]] = defaultdict(list)
    for r in queue:
        levels[r.rank].append(r)
    if len(levels) <= 1:
        return _order_level(queue, policy, cache, fcfs)
    ordered: list[Req] = []
    for rank in sorted(levels):
        ordered.extend(_order_level(levels[rank], policy, cache, fcfs))
    return ordered


def _order_level(queue: list[Req], policy: str, cache: BasePrefixCache, fcfs: bool) -> list[Req]:
    if fcfs or not isinstance(cache, RadixCache):
        return sorted(queue, key=_fcfs_key)
    retracted = [r for r in queue if r.retractions]
    fresh = [r for r in queue if not r.retractions]
    matches = {id(r): cache.match_prefix(r.all_ids[:-1], r.cache_namespace) for r in fresh}
    if policy == "lpm":
        fresh.sort(key=lambda r: (-matches[id(r)].indices.numel(), r.arrival_time))
    elif policy == "dfs-weight":
        fresh = _dfs_weight_order(fresh, {id(r): matches[id(r)].last_node for r in fresh}, cache)
    else:
        raise ValueError(f"unknown schedule policy {policy!r}")
    return sorted(retracted, key=_fcfs_key) + fresh


def _fcfs_key(r: Req) -> tuple[int, float]:
    return (0 if r.retractions else 1, r.arrival_time)


def _dfs_weight_order(
    reqs: list[Req], nodes: dict[int, TreeNode | None], cache: RadixCache
) -> list[Req]:
    """Visit the tree depth-first, heavier subtrees (more waiting requests) first."""
    by_node: dict[int, list[Req]] = defaultdict(list)
    for r in reqs:
        by_node[id(nodes[id(r)])].append(r)
    weight: dict[int, int] = {}
    post_order: list[TreeNode] = []
    stack = list(cache.roots.values())  # one tree per LoRA adapter (and the base's)
    while stack:  # iterative: chat trees can be deep
        node = stack.pop()
        post_order.append(node)
        stack.extend(node.children.values())
    for node in reversed(post_order):
        weight[id(node)] = len(by_node.get(id(node), ())) + sum(
            weight[id(c)] for c in node.children.values()
        )
    ordered: list[Req] = []
    stack = list(cache.roots.values())  # one tree per LoRA adapter (and the base's)
    while stack:
        node = stack.pop()
        ordered.extend(sorted(by_node.get(id(node), ()), key=lambda r: r.arrival_time))
        children = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
        children.sort(key=lambda c: weight[id(c)])  # lightest pushed first, heaviest popped first
        stack.extend(children)
    return ordered
