"""Which data-parallel replica takes a request: round robin, shortest queue or cache-aware.

Pure logic, run by the DP controller inside the API process. Loads are the requests in flight on
each replica, counted exactly by the controller (it sees every dispatch and every finish), so no
replica reports them. The cache-aware policy keeps one approximate radix tree per replica of the
prompts routed there (token ids, LRU-trimmed to a size bound): the replicas' real caches are
never asked, and a tree may hold prefixes a replica has since evicted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue", "cache_aware")


@dataclass(frozen=True)
class CacheAwareConfig:
    """Thresholds of the cache-aware policy (the SGLang router's rule, with request counts sized
    for CPU batches: its abs threshold of 64 requests would never trip here)."""

    # route by prefix only when the best match covers more than this share of the prompt
    cache_threshold: float = 0.3
    # loads are imbalanced when max - min exceeds this AND max > min * balance_rel_threshold
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    max_tree_tokens: int = 1 << 22  # per replica; least recently routed prefixes go first


@dataclass(eq=False)
class _Node:
    key: tuple[int, ...]
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_access: int = 0


class PrefixTree:
    """Approximate radix tree of token-id prompts (one per replica), trimmed LRU-first."""

    def __init__(self) -> None:
        self.root = _Node((), None)
        self.size = 0  # tokens held
        self._clock = 0

    def match(self, ids: list[int]) -> int:
        """Length of the longest prefix of `ids` held in the tree."""
        node, i = self.root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                break
            n = _common_len(child.key, ids, i)
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def insert(self, ids: list[int]) -> None:
        """Add `ids` (splitting nodes where it diverges); marks its path as just used."""
        self._clock += 1
        node, i = self.root, 0
        node.last_access = self._clock
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                leaf = _Node(tuple(ids[i:]), node, last_access=self._clock)
                node.children[ids[i]] = leaf
                self.size += len(leaf.key)
                return
            n = _common_len(child.key, ids, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = self._clock
            node, i = child, i + n

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut `child`'s key after `n` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:n], parent, last_access=child.last_access)
        parent.children[child.key[0]] = upper
        child.key = child.key[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def evict(self, max_tokens: int) -> None:
        """Drop least recently used leaves until the tree holds at most `max_tokens`."""
        if self.size <= max_tokens:
            return
        heap = [(n.last_access, id(n), n) for n in self._leaves()]
        heapq.heapify(heap)
        while self.size > max_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out


def _common_len(key: tuple[int, ...], ids: list[int], start: int) -> int:
    n = min(len(key), len(ids) - start)
    for j in range(n):
        if key[j] != ids[start + j]:
            return j
    return n


class LoadBalancer:
    """Picks a replica for each prompt given the replicas' loads (requests in flight)."""

    def __init__(self, method: str, dp_size: int, config: CacheAwareConfig | None = None) -> None:
        if method == "auto":
            method = "round_robin"
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(f"unknown load balance method {method!r}")
        self.method = method
        self.dp_size = dp_size
        self.config = config or CacheAwareConfig()
        self.trees = [PrefixTree() for _ in range(dp_size)]
        self._next = 0  # round-robin position, also the tie-breaker of the other policies

    def choose(self, input_ids: list[int], loads: list[int]) -> int:
        assert len(loads) == self.dp_size
        if self.method == "round_robin":
            rank = self._next % self.dp_size
        elif self.method == "shortest_queue":
            rank = self._least_loaded(loads, range(self.dp_size))
        else:
            rank = self._cache_aware(input_ids, loads)
        self._next = rank + 1
        return rank

    def _least_loaded(self, loads: list[int], ranks: range | list[int]) -> int:
        """Fewest requests in flight; ties: fewest cached tokens (cache-aware), then round robin."""
        order = [(self._next + k) % self.dp_size for k in range(self.dp_size)]
        candidates = [r for r in order if r in ranks]
        if self.method == "cache_aware":
            return min(candidates, key=lambda r: (loads[r], self.trees[r].size))
        return min(candidates, key=lambda r: loads[r])

    def imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        cfg = self.config
        return hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold

    def _cache_aware(self, ids: list[int], loads: list[int]) -> int:
        all_ranks = range(self.dp_size)
        if self.imbalanced(loads) or not ids:
            rank = self._least_loaded(loads, all_ranks)
        else:
            matches = [tree.match(ids) for tree in self.trees]
            best = max(matches)
            if best / len(ids) > self.config.cache_threshold:
                rank = self._least_loaded(loads, [r for r in all_ranks if matches[r] == best])
            else:
                rank = self._least_loaded(loads, all_ranks)
        tree = self.trees[rank]
        tree.insert(ids)
        tree.evict(self.config.max_tree_tokens)
        return rank
