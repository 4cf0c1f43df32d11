"""What the radix tree looks like from outside: a bounded snapshot (``tree_view``, for the
playground's ``/radix_tree``) and a text dump (``pretty_tree``, for debugging). Read-only:
neither touches access times, hit counts or locks.

Both take the tree's root node (``radix_cache.TreeNode``: ``key``, ``children``,
``hit_count``, ``lock_ref``, ``last_access``, ``node_id``, ``tier``).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from radixlm.radix.base import NodeView, TreeView


def _recency(node: Any) -> tuple[int, int]:
    return node.last_access, node.node_id


def tree_view(cache: Any, root: Any, max_nodes: int, max_ids: int = 16) -> TreeView:
    """At most ``max_nodes`` nodes of ``cache``'s tree (``root`` first), breadth-first, so
    what is left out when the tree is larger is its deepest part; among siblings the most
    recently used come first (and stay when only some fit). Costs the nodes returned plus
    the children looked at, never the whole tree."""
    if max_nodes < 1 or max_ids < 0:
        raise ValueError(f"max_nodes must be >= 1 and max_ids >= 0, got {max_nodes}, "
                         f"{max_ids}")
    out = [NodeView(root.node_id, None, 0, 0, (), root.hit_count, False, False,
                    len(root.children), root.last_access)]
    todo: deque[tuple[Any, int]] = deque([(root, 0)])
    while todo and len(out) < max_nodes:
        node, prefix_len = todo.popleft()
        room = max_nodes - len(out)
        kids = (heapq.nlargest(room, node.children.values(), key=_recency)
                if len(node.children) > room
                else sorted(node.children.values(), key=_recency, reverse=True))
        for child in kids:
            end = prefix_len + len(child.key)
            out.append(NodeView(child.node_id, node.node_id, end, len(child.key),
                                tuple(child.key[:max_ids]), child.hit_count,
                                child.lock_ref > 0, child.lock_ref == 0,
                                len(child.children), child.last_access, child.tier))
            todo.append((child, end))
    return TreeView(True, cache.num_nodes, cache.total_size, cache.evictable_size,
                    cache.protected_size, out, truncated=len(out) - 1 < cache.num_nodes,
                    host_tokens=getattr(cache, "host_size", 0))


def pretty_tree(root: Any, header: str) -> str:
    """``header`` and one indented line per node: its key (first 8 ids), length, lock
    references, access time, hits and (off the device) its tier."""
    lines = [header]

    def visit(node: Any, depth: int) -> None:
        for child in sorted(node.children.values(), key=lambda n: n.key[0]):
            key = child.key if len(child.key) <= 8 else [*child.key[:8], "..."]
            lines.append(f"{'  ' * depth}{key} len={len(child.key)} ref={child.lock_ref} "
                         f"t={child.last_access} hits={child.hit_count}"
                         + ("" if child.tier == "device" else f" tier={child.tier}"))
            visit(child, depth + 1)

    visit(root, 1)
    return "\n".join(lines)
