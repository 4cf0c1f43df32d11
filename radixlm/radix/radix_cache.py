"""Radix tree over token ids whose nodes own KV slot indices (SGLang's RadixAttention).

Each non-root node holds an edge: ``key`` (token ids) and ``slots`` (the KV slot of each of
those tokens), both plain lists of equal length, a multiple of ``page_size``. The path from
the root to a node spells a prefix; concatenating the ``slots`` along it gives that prefix's
KV. Children are keyed by the first token of their edge (the first page with pages > 1).

Bookkeeping kept incrementally, so every operation is proportional to the path it walks:
``lock_ref`` per node (locks on the node or any descendant), ``evictable_size`` /
``protected_size``, and the set of evictable leaves (unlocked, childless, not the root) that
``evict`` heapifies. Access time is a monotonic counter, not the wall clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Literal

from radixlm.radix.base import DEVICE, BasePrefixCache, FreeSlotsFn, MatchResult, TreeView
from radixlm.radix.continuation import ContinuationCursor, continuation
from radixlm.radix.integrity import check_tree
from radixlm.radix.view import pretty_tree, tree_view

EvictionPolicy = Literal["lru", "lfu"]


class TreeNode:
    """One edge of the tree. Handles given out by ``match_prefix`` are ``TreeNode``s."""

    __slots__ = (
        "key",
        "slots",
        "parent",
        "children",
        "lock_ref",
        "direct_locks",
        "last_access",
        "hit_count",
        "node_id",
        "dead",
        "tier",
    )

    def __init__(self, key: list[int], slots: list[int], parent: TreeNode | None, node_id: int):
        self.key = key
        self.slots = slots
        self.parent = parent
        self.children: dict[int | tuple[int, ...], TreeNode] = {}
        self.lock_ref = 0  # locks taken on this node or on any descendant
        self.direct_locks = 0  # locks taken on this node itself
        self.last_access = 0
        self.hit_count = 0
        self.node_id = node_id
        self.dead = False  # evicted or dropped by reset: no longer a valid handle
        self.tier = DEVICE  # where ``slots`` point: the KV pool, or a slower tier's store

    def __repr__(self) -> str:
        head = self.key[:4]
        more = "..." if len(self.key) > 4 else ""
        return f"TreeNode(id={self.node_id}, len={len(self.key)}, key={head}{more})"


def _as_list(values: Sequence[int]) -> list[int]:
    if type(values) is list:
        return values
    tolist = getattr(values, "tolist", None)  # numpy arrays, torch tensors, array.array
    return list(tolist()) if tolist is not None else list(values)


def _is_evictable_leaf(node: TreeNode) -> bool:
    """Unlocked, on the device, without a child on the device, and not the root (the only
    node without a parent). Without tiers: unlocked, childless, not the root."""
    if node.parent is None or node.lock_ref or node.tier != DEVICE:
        return False
    return not node.children or all(c.tier != DEVICE for c in node.children.values())


def eviction_key(node: TreeNode, policy: str) -> tuple[int, int, int, TreeNode]:
    """Heap order of eviction candidates: least recently (with ``"lfu"``: least often, then
    least recently) used first."""
    hits = node.hit_count if policy == "lfu" else 0
    return (hits, node.last_access, node.node_id, node)


def check_handle(node: TreeNode) -> None:
    if not isinstance(node, TreeNode) or node.dead:
        raise ValueError(f"stale or foreign cache handle: {node!r}")


def path_slots(root: TreeNode, node: TreeNode) -> list[int]:
    """The slots along the path from ``root`` down to ``node``, concatenated."""
    pieces: list[list[int]] = []
    while node is not root:
        pieces.append(node.slots)
        node = node.parent  # type: ignore[assignment]
    slots: list[int] = []
    for piece in reversed(pieces):
        slots += piece
    return slots


def _common_prefix_len(key: list[int], tokens: list[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``.

    Compares slices (C speed) and bisects to the first mismatch, so there is no per-token
    Python work except over the last few positions.
    """
    hi = min(len(key), len(tokens) - start)
    if (key if hi == len(key) else key[:hi]) == tokens[start : start + hi]:
        return hi
    lo = 0  # invariant: key[:lo] matches, and a mismatch lies in [lo, hi)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if key[lo:mid] == tokens[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and key[lo] == tokens[start + lo]:
        lo += 1
    return lo


class RadixCache(BasePrefixCache):
    """Prefix cache that shares KV slots between requests through a radix tree.

    ``free_slots`` is called with the slots of evicted nodes (one call per ``evict``).
    ``eviction_policy``: ``"lru"`` evicts the least recently accessed leaf first; ``"lfu"``
    the least often matched leaf, ties broken by access time. With ``page_size > 1`` matches
    are rounded down to whole pages and ``insert`` requires page-aligned lengths.

    Handles (``MatchResult.last_node``) stay valid across splits; they become invalid once
    their node is evicted (possible only while unlocked) or the cache is reset, and
    ``lock`` / ``unlock`` on such a handle raise ``ValueError``.
    """

    def __init__(
        self,
        free_slots: FreeSlotsFn,
        eviction_policy: EvictionPolicy = "lru",
        page_size: int = 1,
    ) -> None:
        if eviction_policy not in ("lru", "lfu"):
            raise ValueError(f"eviction_policy must be 'lru' or 'lfu', got {eviction_policy!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._free_slots = free_slots
        self.eviction_policy: EvictionPolicy = eviction_policy
        self.page_size = page_size
        self._clock = 0
        self._next_id = 0
        self._num_nodes = 0  # nodes in the tree, the root excluded
        self._fresh_tree()

    # ------------------------------------------------------------------ helpers

    def _new_node(self, key: list[int], slots: list[int], parent: TreeNode | None) -> TreeNode:
        self._next_id += 1
        self._num_nodes += 1
        return TreeNode(key, slots, parent, self._next_id)

    def _child_key(self, tokens: list[int], pos: int) -> int | tuple[int, ...]:
        if self.page_size == 1:
            return tokens[pos]
        return tuple(tokens[pos : pos + self.page_size])

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child``'s edge after ``split_len`` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < split_len < len(child.key)
        upper = self._new_node(child.key[:split_len], child.slots[:split_len], parent)
        upper.lock_ref = child.lock_ref  # every lock through child also passes through upper
        upper.last_access = child.last_access
        upper.hit_count = child.hit_count
        parent.children[self._child_key(upper.key, 0)] = upper
        child.key = child.key[split_len:]
        child.slots = child.slots[split_len:]
        child.parent = upper
        upper.children[self._child_key(child.key, 0)] = child
        return upper

    def _walk(self, tokens: list[int], now: int = 0, hits: int = 0,
              read_only: bool = False) -> tuple[TreeNode, int]:
        """Follow ``tokens`` from the root, splitting where the match ends inside an edge.

        Returns the deepest node covering exactly the matched prefix and its length. Every
        node on the path gets access time ``now`` and ``hits`` more LFU hits. ``read_only``:
        no split and no touch; the length then includes a match that ends inside an edge
        (and the node is the one above it).
        """
        page = self.page_size
        end = len(tokens) - len(tokens) % page
        node, pos = self._root, 0
        while pos < end:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            match_len = _common_prefix_len(child.key, tokens, pos)
            match_len -= match_len % page
            if match_len < len(child.key):
                if read_only:
                    return node, pos + match_len
                child = self._split(child, match_len)
            if not read_only:
                child.last_access = now
                child.hit_count += hits
            node, pos = child, pos + match_len
        return node, pos

    # ------------------------------------------------------------------ interface

    def match_prefix(self, token_ids: Sequence[int], count_hit: bool = True) -> MatchResult:
        """Longest cached prefix of ``token_ids`` (rounded down to whole pages).

        Splits the last node when the match ends inside its edge, so ``last_node`` covers
        exactly the returned slots. Touches the path (access time; with ``count_hit`` the
        hit count that LFU and ``view`` read).
        """
        tokens = _as_list(token_ids)
        node, _ = self._walk(tokens, self._tick(), hits=int(count_hit))
        return MatchResult(slots=path_slots(self._root, node), last_node=node)

    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        """Length ``match_prefix`` would return, without splitting or touching anything."""
        return self._walk(_as_list(token_ids), read_only=True)[1]

    def continuation(self, token_ids: Sequence[int], max_len: int,
                     cursor: ContinuationCursor | None = None) -> list[int]:
        """Up to ``max_len`` cached tokens after ``token_ids`` (most recently used branch
        where paths fork), [] unless a cached path extends all of ``token_ids``. Read-only;
        see ``BasePrefixCache.continuation`` and ``ContinuationCursor``."""
        return continuation(self, _as_list(token_ids), max_len, cursor)

    def insert(self, token_ids: Sequence[int], slots: Sequence[int]) -> int:
        """Add ``token_ids`` with their KV ``slots``; return how many leading tokens were
        already cached. The cache takes ``slots[returned:]``; the caller frees its own
        ``slots[prefix_len:returned]`` (duplicates of what the tree already holds).

        Raises ``ValueError`` on mismatched lengths or a length that is not page-aligned.
        """
        tokens, slot_list = _as_list(token_ids), _as_list(slots)
        if len(tokens) != len(slot_list):
            raise ValueError(f"{len(tokens)} token ids but {len(slot_list)} slots")
        if len(tokens) % self.page_size:
            raise ValueError(f"insert length {len(tokens)} is not a multiple of page_size")
        node, pos = self._walk(tokens, self._tick(), hits=0)
        cached = self._settle_path(node, pos, slot_list)
        if pos < len(tokens):
            leaf = self._new_node(tokens[pos:], slot_list[pos:], node)
            leaf.last_access = self._clock
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._evictable_leaves.discard(node)
            self._evictable_leaves.add(leaf)
            self._evictable_size += len(leaf.key)
        return cached

    def _settle_path(self, node: TreeNode, pos: int, slots: list[int]) -> int:
        """``insert`` walked ``pos`` tokens to ``node``: how many of them were cached on the
        device (the caller's slots for those are duplicates). A tiered tree moves nodes of
        slower tiers on that path to the device here, taking the caller's ``slots``."""
        return pos

    def lock(self, node: TreeNode) -> None:
        check_handle(node)
        node.direct_locks += 1
        self._evictable_leaves.discard(node)
        while node is not self._root:
            if node.lock_ref == 0:
                self._evictable_size -= len(node.key)
                self._protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        check_handle(node)
        if node.direct_locks <= 0:
            raise ValueError(f"unlock without a matching lock: {node!r}")
        node.direct_locks -= 1
        start = node
        while node is not self._root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_size += len(node.key)
                self._protected_size -= len(node.key)
            node = node.parent  # type: ignore[assignment]
        if _is_evictable_leaf(start):
            self._evictable_leaves.add(start)

    def evict(self, num_tokens: int) -> int:
        """Free whole unlocked leaves, least recently (or least often) used first, until at
        least ``num_tokens`` slots are freed or nothing evictable is left. A parent left
        childless and unlocked becomes a candidate in the same call."""
        if num_tokens <= 0 or not self._evictable_leaves:
            return 0
        policy = self.eviction_policy
        heap = [eviction_key(leaf, policy) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < num_tokens and heap:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            assert parent is not None and _is_evictable_leaf(node)
            self._evictable_leaves.discard(node)
            self._evictable_size -= len(node.key)
            freed += node.slots
            self._retire(node)
            if _is_evictable_leaf(parent):
                self._evictable_leaves.add(parent)
                heapq.heappush(heap, eviction_key(parent, policy))
        if freed:
            self._free_slots(freed)
        return len(freed)

    def _retire(self, node: TreeNode) -> None:
        """An evicted leaf leaves the device (its slots are freed by the caller): here it
        leaves the tree; a tiered tree may keep it in a slower tier instead."""
        del node.parent.children[self._child_key(node.key, 0)]  # type: ignore[union-attr]
        node.dead, node.parent = True, None
        self._num_nodes -= 1

    @property
    def evictable_size(self) -> int:
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        return self._protected_size

    def _nodes(self) -> list[TreeNode]:
        """Every node except the root, parents before children."""
        out: list[TreeNode] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, the root excluded (kept incrementally)."""
        return self._num_nodes

    def view(self, max_nodes: int, max_ids: int = 16) -> TreeView:
        """See ``BasePrefixCache.view`` and ``radix.view.tree_view``."""
        return tree_view(self, self._root, max_nodes, max_ids)

    def all_slots(self) -> list[int]:
        slots: list[int] = []
        for node in self._nodes():
            slots += node.slots
        return slots

    def _fresh_tree(self) -> None:
        self._root = self._new_node([], [], None)
        self._num_nodes = 0
        self._evictable_size = 0
        self._protected_size = 0
        self._evictable_leaves: set[TreeNode] = set()

    def reset(self) -> None:
        """Drop the whole tree without freeing; old handles become invalid."""
        for node in self._nodes():
            node.dead = True
        self._root.dead = True
        self._fresh_tree()

    def check_integrity(self) -> None:
        off_device = check_tree(self, self._root, self._nodes(), _is_evictable_leaf)
        assert not off_device, "a node outside the device tier in a tree without tiers"

    def pretty_print(self) -> str:
        return pretty_tree(self._root, f"RadixCache(total={self.total_size}, evictable="
                                       f"{self.evictable_size}, protected="
                                       f"{self.protected_size}, policy={self.eviction_policy})")
