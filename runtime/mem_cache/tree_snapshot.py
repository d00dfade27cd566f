"""A bounded picture of the radix tree for the dashboard (scheduler process, only when asked).

The tree may hold many thousands of nodes; the dashboard needs the ones that matter: shared
prefixes that many requests reused and long cached sequences. Nodes are taken best-first from the
root (a node's parent is always taken before it), so the picture is a connected top of the tree
whatever the cap. Token ids are sent as is; the API process decodes the previews.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import replace

from radixgen.io_struct import RadixNodeView
from radixgen.runtime.mem_cache.radix_cache import RadixCache, TreeNode

PREVIEW_TOKENS = 24  # token ids of a node's key sent for its text preview


def _priority(node: TreeNode) -> int:
    """Hot shared prefixes first, then long ones: what a reader looks for."""
    return (node.hits + 1) * len(node.key)


def snapshot_tree(cache: RadixCache, max_nodes: int) -> tuple[list[RadixNodeView], bool]:
    """Up to `max_nodes` nodes, best first; the flag says whether any node was left out.

    Cost: O(max_nodes * log) plus the children of the nodes taken; never the whole tree.
    """
    now = time.monotonic()
    heap: list[tuple[int, int, TreeNode, int, int]] = []
    for child in cache.root.children.values():
        heapq.heappush(heap, (-_priority(child), child.id, child, -1, 0))
    views: list[RadixNodeView] = []
    shown_children: dict[int, int] = {}
    while heap and len(views) < max_nodes:
        _, _, node, parent_id, depth = heapq.heappop(heap)
        prefix = depth + len(node.key)
        for child in node.children.values():
            heapq.heappush(heap, (-_priority(child), child.id, child, node.id, prefix))
        shown_children[parent_id] = shown_children.get(parent_id, 0) + 1
        views.append(
            RadixNodeView(
                id=node.id,
                parent=parent_id,
                tokens=len(node.key),
                prefix_tokens=prefix,
                lock_ref=node.lock_ref,
                hits=node.hits,
                idle_s=round(max(0.0, now - node.last_access), 3),
                children=len(node.children),
                hidden_children=0,
                preview_ids=list(node.key[:PREVIEW_TOKENS]),
                preview_truncated=len(node.key) > PREVIEW_TOKENS,
            )
        )
    out = [replace(v, hidden_children=v.children - shown_children.get(v.id, 0)) for v in views]
    return out, bool(heap)
