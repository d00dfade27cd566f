"""RadixAttention's prefix cache: a radix tree over token ids whose nodes own KV-pool slots.

Runs in the scheduler process. A request's prompt is matched on admission and its KV reused; a
finished request's tokens are inserted so later requests (the next chat turn, the next few-shot
question) reuse them. Nodes used by running requests are locked (with their ancestors); eviction
frees unlocked leaves in least-recently-used order. With `page_size` > 1 keys are matched and
stored in whole pages.

KV computed under a LoRA adapter differs from the base model's for the same tokens, so each
adapter has a tree of its own (a root per namespace, `roots`; the base model's is `root`): a
prefix cached under one adapter is never matched by another's request or the base's, while
requests of one adapter share as before. Eviction, locking and accounting span all trees.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.req import Req

_EMPTY = torch.empty(0, dtype=torch.long)
_ids = itertools.count()


class TreeNode:
    __slots__ = ("children", "hits", "id", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, parent: TreeNode | None = None) -> None:
        self.children: dict[int | tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key: list[int] = []
        self.value: torch.Tensor = _EMPTY
        self.lock_ref = 0
        self.last_access = time.monotonic()
        self.hits = 0  # admissions that reused this node's tokens (the dashboard shows them)
        self.id = next(_ids)

    def __lt__(self, other: TreeNode) -> bool:  # heap order: least recently used first
        return self.last_access < other.last_access


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the common prefix, by binary search over C-speed slice comparisons."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache(BasePrefixCache):
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        page_size: int = 1,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.page_size = page_size
        # called with each leaf before eviction frees its slots (HiRadixCache: copy it to the
        # host tier); None costs the plain tree nothing
        self._backup_leaf: Callable[[TreeNode], None] | None = None
        self.reset()

    # --- tree primitives --------------------------------------------------------------------

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        # namespace (a LoRA adapter's name; None: the base model) -> its tree's root
        self.roots: dict[str | None, TreeNode] = {None: self.root}
        self._evictable = 0
        self._protected = 0
        # NOTE: exactly the unlocked childless non-root nodes, kept up to date by every change
        # of children or lock count, so eviction never scans the whole tree
        self._evictable_leaves: set[TreeNode] = set()

    def _child_key(self, key: list[int]) -> int | tuple[int, ...]:
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _root(self, namespace: str | None) -> TreeNode:
        root = self.roots.get(namespace)
        if root is None:
            root = self.roots[namespace] = TreeNode()
            root.lock_ref = 1
        return root

    def match_prefix(self, key: list[int], namespace: str | None = None) -> MatchResult:
        key = key[: self._aligned(len(key))]
        node, values = self._match(key, namespace)
        value = torch.cat(values) if values else _EMPTY
        return MatchResult(value, node)

    def _match(
        self, key: list[int], namespace: str | None = None
    ) -> tuple[TreeNode, list[torch.Tensor]]:
        now = time.monotonic()
        node = self._root(namespace)
        node.last_access = now
        values: list[torch.Tensor] = []
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.last_access = now
            n = self._aligned(common_prefix_len(child.key, key))
            if n < len(child.key):
                if n > 0:
                    node = self._split(child, n)
                    values.append(node.value)
                break
            values.append(child.value)
            node = child
            key = key[n:]
        return node, values

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after n tokens; return the new upper node (which keeps child's lock count)."""
        upper = TreeNode(child.parent)
        upper.key, upper.value = child.key[:n], child.value[:n]
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.hits = child.hits
        assert child.parent is not None
        child.parent.children[self._child_key(upper.key)] = upper
        child.key, child.value = child.key[n:], child.value[n:]
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def insert(self, key: list[int], value: torch.Tensor, namespace: str | None = None) -> int:
        """Insert key -> slots under `namespace`; return how many leading tokens were already
        cached there.

        The caller still owns `value[:returned]` duplicates and must free them.
        """
        n_total = self._aligned(len(key))
        key, value = key[:n_total], value[:n_total]
        now = time.monotonic()
        node = self._root(namespace)
        matched = 0
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                leaf = TreeNode(node)
                leaf.key, leaf.value = list(key), value.clone()
                leaf.last_access = now
                node.children[self._child_key(key)] = leaf
                self._evictable_leaves.discard(node)
                self._evictable_leaves.add(leaf)
                self._evictable += len(key)
                return matched
            child.last_access = now
            n = self._aligned(common_prefix_len(child.key, key))
            if n < len(child.key):
                child = self._split(child, n)
            matched += n
            node = child
            key, value = key[n:], value[n:]
        return matched

    # --- locking ----------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        assert node is not None, "radix matches always return a node"
        while node.parent is not None:  # up to its tree's root
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        assert node is not None, "radix matches always return a node"
        while node.parent is not None:
            assert node.lock_ref > 0, "unlocking an unlocked radix node"
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._evictable_leaves.add(node)
            node.lock_ref -= 1
            assert node.parent is not None
            node = node.parent

    def record_hit(self, node: TreeNode | None) -> None:
        """A request was admitted reusing the prefix ending at `node`: count a hit on it and its
        ancestors (the same walk as `inc_lock_ref`, once per admission)."""
        while node is not None and node.parent is not None:
            node.hits += 1
            node = node.parent

    # --- request lifecycle --------------------------------------------------------------------

    def cache_finished_req(self, req: Req) -> None:
        row = req.req_pool_idx
        assert row is not None
        kv_len = req.kv_len
        slots = self.req_to_token_pool.req_to_token[row, :kv_len].clone()
        # NOTE: KV past the request's tokens (a step launched for a token that never arrived, a
        # failed step's draft) is freed with the unaligned tail, never keyed
        known = len(req.origin_input_ids) + len(req.output_ids)
        aligned = self._aligned(min(kv_len, known))
        already = self.insert(req.all_ids[:aligned], slots[:aligned], req.cache_namespace)
        # duplicates of what the tree already held, and the unaligned tail, go back to the pool
        self.kv_pool.free(slots[req.cache_protected_len : already])
        self.kv_pool.free(slots[aligned:])
        self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(row)
        req.release_kv()

    def cache_unfinished_req(self, req: Req, length: int | None = None) -> None:
        row = req.req_pool_idx
        assert row is not None
        aligned = self._aligned(req.kv_len if length is None else min(length, req.kv_len))
        if aligned <= req.cache_protected_len:
            return
        key = req.all_ids[:aligned]
        slots = self.req_to_token_pool.req_to_token[row, :aligned].clone()
        already = self.insert(key, slots, req.cache_namespace)
        self.kv_pool.free(slots[req.cache_protected_len : already])
        node, values = self._match(key, req.cache_namespace)
        tree_slots = torch.cat(values)
        assert tree_slots.numel() == aligned
        start = req.cache_protected_len
        self.req_to_token_pool.write_row(row, start, tree_slots[start:])
        self.inc_lock_ref(node)
        self.dec_lock_ref(req.last_node)
        req.last_node = node
        req.cache_protected_len = aligned

    # --- eviction and sizes -------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        if num_tokens <= 0 or not self._evictable_leaves:
            return 0
        leaves = list(self._evictable_leaves)
        heapq.heapify(leaves)
        freed = 0
        backup = self._backup_leaf  # None unless a lower tier keeps what the pool drops
        while freed < num_tokens and leaves:
            leaf = heapq.heappop(leaves)
            if backup is not None:
                backup(leaf)
            self.kv_pool.free(leaf.value)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            self._evictable_leaves.remove(leaf)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key)]
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                self._evictable_leaves.add(parent)
                heapq.heappush(leaves, parent)
        return freed

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def _iter_nodes(self) -> Iterator[TreeNode]:
        stack = [c for root in self.roots.values() for c in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def cached_slots(self) -> list[torch.Tensor]:
        return [n.value for n in self._iter_nodes()]

    def check_invariants(self) -> None:
        """Debug: the kept evictable-leaf set equals what a full scan finds."""
        scanned = {n for n in self._iter_nodes() if not n.children and n.lock_ref == 0}
        assert scanned == self._evictable_leaves, "evictable-leaf set out of date"
