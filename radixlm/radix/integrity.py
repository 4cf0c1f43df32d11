"""The radix tree's integrity check, shared by the tree and its tiered variant. Pure Python.

``check_tree`` walks every node once and raises ``AssertionError`` where the incremental
bookkeeping (lock references, evictable / protected sizes, the evictable-leaf set, the node
count) disagrees with the tree, or where tiers are out of order: along every path from the
root the device tier comes first, so a node on the device has only device ancestors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.radix.base import DEVICE, TIER_ORDER


def check_tree(cache: Any, root: Any, nodes: list[Any],
               is_evictable_leaf: Callable[[Any], bool]) -> dict[str, int]:
    """Check ``cache``'s tree (``root``, and ``nodes``: every other node). Returns the
    tokens held in each tier other than the device (``{}`` when every node is on the
    device); the caller compares them with its own tier sizes."""
    assert root.parent is None and not root.key and not root.dead
    assert root.direct_locks >= 0 and root.lock_ref == 0 and root.tier == DEVICE
    evictable = protected = 0
    off_device: dict[str, int] = {}
    seen: dict[str, set[int]] = {}
    leaves: set[Any] = set()
    for node in [root, *nodes]:
        child_refs = 0
        for ckey, child in node.children.items():
            assert child.parent is node, f"{child!r} has the wrong parent"
            assert not child.dead, f"{child!r} is dead but still in the tree"
            assert ckey == cache._child_key(child.key, 0), f"{child!r} under key {ckey!r}"
            assert TIER_ORDER[child.tier] >= TIER_ORDER[node.tier], (
                f"{child!r} ({child.tier}) below {node!r} ({node.tier})")
            child_refs += child.lock_ref
        if node is root:
            continue
        size = len(node.key)
        assert size > 0 and size == len(node.slots), f"{node!r}: bad edge lengths"
        assert size % cache.page_size == 0, f"{node!r}: edge not page-aligned"
        assert node.direct_locks >= 0
        assert node.lock_ref == node.direct_locks + child_refs, f"{node!r}: lock_ref"
        if node.tier != DEVICE:
            assert node.lock_ref == 0, f"{node!r}: locked outside the device tier"
            off_device[node.tier] = off_device.get(node.tier, 0) + size
        elif node.lock_ref:
            protected += size
        else:
            evictable += size
        if is_evictable_leaf(node):
            leaves.add(node)
        owned = seen.setdefault(node.tier, set())
        for slot in node.slots:
            assert slot not in owned, f"{node.tier} slot {slot} owned twice"
            owned.add(slot)
    assert evictable == cache.evictable_size, f"evictable {evictable} != {cache.evictable_size}"
    assert protected == cache.protected_size, f"protected {protected} != {cache.protected_size}"
    assert leaves == cache._evictable_leaves, "evictable-leaf set out of date"
    assert len(nodes) == cache.num_nodes, "node count out of date"
    return off_device
