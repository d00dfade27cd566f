"""Waiting-queue order: FCFS, longest-prefix-match first, or radix-tree DFS order (scheduler process).

Cache-aware policies match every waiting request against the radix tree, so they only pay while
the queue is short; past `max_policy_queue` they fall back to FCFS.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from radixgen.runtime.mem_cache.radix_cache import RadixCache, TreeNode

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.scheduler.req import Req

MAX_POLICY_QUEUE = 256


def order_waiting_queue(
    queue: list[Req], policy: str, cache: BasePrefixCache, max_policy_queue: int = MAX_POLICY_QUEUE
) -> list[Req]:
    """Return the queue in admission order (retracted requests always go first)."""
    if policy == "fcfs" or not isinstance(cache, RadixCache) or len(queue) > max_policy_queue:
        return sorted(queue, key=_fcfs_key)
    retracted = [r for r in queue if r.retractions]
    fresh = [r for r in queue if not r.retractions]
    matches = {id(r): cache.match_prefix(r.all_ids[:-1]) for r in fresh}
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
    stack = [cache.root]
    while stack:  # iterative: chat trees can be deep
        node = stack.pop()
        post_order.append(node)
        stack.extend(node.children.values())
    for node in reversed(post_order):
        weight[id(node)] = len(by_node.get(id(node), ())) + sum(
            weight[id(c)] for c in node.children.values()
        )
    ordered: list[Req] = []
    stack = [cache.root]
    while stack:
        node = stack.pop()
        ordered.extend(sorted(by_node.get(id(node), ()), key=lambda r: r.arrival_time))
        children = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
        children.sort(key=lambda c: weight[id(c)])  # lightest pushed first, heaviest popped first
        stack.extend(children)
    return ordered
