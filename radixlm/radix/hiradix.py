"""The radix tree with a host tier (SGLang's HiRadixCache, on our tree). Pure Python.

Every node has a tier: ``"device"`` (its ``slots`` are KV pool slots) or ``"host"`` (its
``slots`` are slots of the host tier's store, ``HostStore``, holding a copy of the K/V in
the pool's format). Along every path the device nodes come first, so the device part of a
match is a prefix and the host part continues it.

Eviction moves instead of dropping: the least recently used device leaf (a device node
without device children, unlocked) is copied to the host tier, which first drops its own
least recently used leaves if it lacks room; only a node the host tier cannot hold at all
is dropped, with the host nodes below it. A match walks both tiers; the caller promotes
the host part it wants (``promote``: device slots it allocated and wrote), and an
``insert`` over host nodes gives them the caller's freshly computed slots. So LRU runs
across the tiers: device -> host -> gone, and a hit anywhere brings a prefix back to the
device. Host nodes are never locked (a lock is taken only on a device match).

Sizes: ``evictable_size`` / ``protected_size`` count device slots as in ``RadixCache``;
``host_size`` counts host slots. Invariant (``check_integrity``): host_size + the store's
free slots == its capacity.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from radixlm.radix.base import DEVICE, HOST, FreeSlotsFn, HostStore, MatchResult
from radixlm.radix.integrity import check_tree
from radixlm.radix.radix_cache import (
    EvictionPolicy,
    RadixCache,
    TreeNode,
    _as_list,
    _is_evictable_leaf,
    check_handle,
    eviction_key,
    path_slots,
)


class HiRadixCache(RadixCache):
    """``RadixCache`` whose evicted leaves move to a host tier (see the module docstring).

    ``host``: the host tier's store. Counters (tokens, monotonic): ``demoted_tokens``
    (device -> host), ``promoted_tokens`` (host -> device, by ``promote`` or by an
    ``insert`` that recomputed them), ``host_evicted_tokens`` (dropped from the host tier
    for room), ``dropped_tokens`` (evicted from the device with no room on the host).
    """

    def __init__(self, free_slots: FreeSlotsFn, host: HostStore,
                 eviction_policy: EvictionPolicy = "lru", page_size: int = 1) -> None:
        self._host = host
        self.demoted_tokens = self.promoted_tokens = 0
        self.host_evicted_tokens = self.dropped_tokens = 0
        super().__init__(free_slots, eviction_policy=eviction_policy, page_size=page_size)

    def _fresh_tree(self) -> None:
        super()._fresh_tree()
        self._host_size = 0
        self._host_leaves: set[TreeNode] = set()  # host nodes without children

    @property
    def host_size(self) -> int:
        """Host-tier slots the tree holds."""
        return self._host_size

    @property
    def host_capacity(self) -> int:
        return self._host.capacity

    # ------------------------------------------------------------------ tree hooks
    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        upper = super()._split(child, split_len)
        upper.tier = child.tier  # slots of either tier slice alike
        return upper

    def _settle_path(self, node: TreeNode, pos: int, slots: list[int]) -> int:
        """Host nodes on an inserted path take the caller's slots (it computed their K/V):
        the device-cached part ends where the host part starts."""
        host_path: list[tuple[TreeNode, int]] = []
        end = pos
        while node.tier == HOST:
            host_path.append((node, end))
            end -= len(node.key)
            node = node.parent  # type: ignore[assignment]
        for host_node, node_end in reversed(host_path):
            self._to_device(host_node, slots[node_end - len(host_node.key):node_end])
        return end

    def _retire(self, node: TreeNode) -> None:
        """An evicted device leaf: to the host tier if it can hold it, else dropped with the
        host nodes below it."""
        if not self._demote(node):
            self.dropped_tokens += len(node.key)
            self._drop(node)

    def _demote(self, node: TreeNode) -> bool:
        size = len(node.key)
        if size > self._host.capacity:
            return False
        if self._host.num_free < size:
            self.evict_host(size - self._host.num_free)
        host_slots = self._host.demote(node.slots)
        if host_slots is None:
            return False
        node.slots, node.tier = host_slots, HOST
        self._host_size += size
        self.demoted_tokens += size
        if not node.children:
            self._host_leaves.add(node)
        return True

    def _drop(self, node: TreeNode) -> None:
        """Take ``node`` (a device leaf being evicted, or a host node) and the host nodes
        below it out of the tree, giving their host slots back."""
        stack = [node]
        while stack:
            sub = stack.pop()
            stack.extend(sub.children.values())
            if sub.tier == HOST:
                self._host.free(sub.slots)
                self._host_size -= len(sub.key)
                self._host_leaves.discard(sub)
            if sub is not node:
                sub.dead, sub.parent = True, None
                self._num_nodes -= 1
        parent = node.parent
        super()._retire(node)
        if parent is not None and parent.tier == HOST and not parent.children:
            self._host_leaves.add(parent)

    def _to_device(self, node: TreeNode, slots: list[int]) -> None:
        """Host node -> device node with ``slots`` (which already hold its K/V)."""
        size = len(node.key)
        assert node.tier == HOST and len(slots) == size and node.lock_ref == 0
        self._host.free(node.slots)
        node.slots, node.tier = list(slots), DEVICE
        self._host_size -= size
        self._host_leaves.discard(node)
        self._evictable_size += size
        self.promoted_tokens += size
        self._evictable_leaves.discard(node.parent)
        if _is_evictable_leaf(node):
            self._evictable_leaves.add(node)

    # ------------------------------------------------------------------ interface
    def match_prefix(self, token_ids: Sequence[int], count_hit: bool = True) -> MatchResult:
        """The longest cached prefix over both tiers: ``slots`` and ``last_node`` cover its
        device part, ``host_nodes`` the host nodes that continue it (see ``MatchResult``).
        Touches the whole path, so a matched host node is the host tier's most recent."""
        tokens = _as_list(token_ids)
        node, _ = self._walk(tokens, self._tick(), hits=int(count_hit))
        host_nodes: list[TreeNode] = []
        while node.tier == HOST:
            host_nodes.append(node)
            node = node.parent  # type: ignore[assignment]
        host_nodes.reverse()
        return MatchResult(path_slots(self._root, node), node, host_nodes)

    def promote(self, node: TreeNode, slots: Sequence[int]) -> None:
        """Move host node ``node`` to the device: ``slots`` are pool slots the caller
        allocated and wrote ``node``'s K/V into (from ``node.slots`` of the host store); the
        tree owns them from now on and gives the host slots back. ``node``'s parent must be
        on the device (promote top down). Raises ``ValueError`` otherwise."""
        check_handle(node)
        if node.tier != HOST or node.parent is None or node.parent.tier != DEVICE:
            raise ValueError(f"{node!r} is not a host node below the device tier")
        if len(slots) != len(node.key):
            raise ValueError(f"{len(slots)} slots for a node of {len(node.key)} tokens")
        self._to_device(node, _as_list(slots))

    def lock(self, node: TreeNode) -> None:
        """See ``RadixCache.lock``; a host node cannot be locked (promote it first)."""
        check_handle(node)
        if node.tier != DEVICE:
            raise ValueError(f"cannot lock {node!r}: its K/V is in the {node.tier} tier")
        super().lock(node)

    def evict_host(self, num_tokens: int) -> int:
        """Drop least recently (or least often) used host leaves until at least
        ``num_tokens`` host slots are free again or the host tier is empty. Returns how many
        host slots were given back."""
        policy = self.eviction_policy
        heap = [eviction_key(leaf, policy) for leaf in self._host_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            freed += len(node.key)
            self._drop(node)
            if parent in self._host_leaves:
                heapq.heappush(heap, eviction_key(parent, policy))
        self.host_evicted_tokens += freed
        return freed

    def flush_host(self) -> int:
        """Drop the whole host tier; returns the tokens dropped."""
        return self.evict_host(self._host_size)

    def all_slots(self) -> list[int]:
        """Every pool slot the tree owns (device nodes; host slots are the store's)."""
        return [slot for node in self._nodes() if node.tier == DEVICE for slot in node.slots]

    def host_slots(self) -> list[int]:
        """Every host-store slot the tree holds (for integrity checks)."""
        return [slot for node in self._nodes() if node.tier == HOST for slot in node.slots]

    def reset(self) -> None:
        """Drop the whole tree: device slots are not freed (the pool is reset alongside, or
        the caller frees ``all_slots()``); host slots go back to the store."""
        for node in self._nodes():
            if node.tier == HOST:
                self._host.free(node.slots)
        super().reset()

    def check_integrity(self) -> None:
        nodes = self._nodes()
        off_device = check_tree(self, self._root, nodes, _is_evictable_leaf)
        assert set(off_device) <= {HOST}, f"unknown tiers {set(off_device)}"
        host = off_device.get(HOST, 0)
        assert host == self._host_size, f"host {host} != {self._host_size}"
        leaves = {n for n in nodes if n.tier == HOST and not n.children}
        assert leaves == self._host_leaves, "host-leaf set out of date"
        assert self._host_size + self._host.num_free == self._host.capacity, (
            f"host slots leaked: {self._host_size} held + {self._host.num_free} free != "
            f"{self._host.capacity}")

    def pretty_print(self) -> str:
        return super().pretty_print() + f"\n(host tier: {self._host_size} tokens)"
