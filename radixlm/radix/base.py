"""The prefix-cache interface the scheduler talks to.

Two implementations serve it: ``RadixCache`` (a radix tree over token ids whose nodes own
KV slot indices) and ``NoSharingCache`` (same interface, never shares), so that every
comparison between cache on and off is like for like.

Ownership of KV slots. Every usable slot of the pool is at any moment in exactly one of
three places: the allocator's free list, the cache (``total_size`` counts them), or a
running request (slots it computed that the cache does not own yet). ``insert`` moves
slots from a request into the cache; ``evict`` moves them from the cache to the free list
through the ``free_slots`` callback given at construction. Pure Python: no torch here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixlm.radix.continuation import ContinuationCursor

FreeSlotsFn = Callable[[list[int]], None]

# Where a node's K/V lives. The device tier is the KV pool; the host tier a store of the same
# format outside the pool's capacity (``HostStore``). Along every path from the root the
# device comes first: a node on the device has only device ancestors.
DEVICE, HOST = "device", "host"
TIER_ORDER = {DEVICE: 0, HOST: 1}


class HostStore(Protocol):
    """What a tiered radix tree asks of the host tier's store: slots of its own (indices
    like the pool's, into another buffer) holding copies of pool K/V.

    ``capacity``: usable host slots; ``num_free``: those not holding anything now.
    ``demote(slots)`` copies the K/V of the pool's ``slots`` into ``len(slots)`` newly taken
    host slots and returns them (None, nothing taken, if fewer are free); ``free`` gives host
    slots back. The tree owns every host slot it was given until it frees it."""

    @property
    def capacity(self) -> int: ...

    @property
    def num_free(self) -> int: ...

    def demote(self, slots: list[int]) -> list[int] | None: ...

    def free(self, host_slots: list[int]) -> None: ...


@dataclass
class MatchResult:
    """What ``match_prefix`` found.

    ``slots[i]`` is the KV slot holding token ``i`` of the matched prefix. ``last_node``
    is an opaque handle: pass it to ``lock`` / ``unlock``. The slots are only safe to use
    while that handle is locked (an unlocked prefix may be evicted at the next ``evict``).
    ``host_nodes``: in a tiered tree, the nodes of the host tier that continue the match
    below ``last_node``, top down (their K/V can be promoted instead of recomputed); they
    are not locked and may leave the host tier at the next eviction.
    """

    slots: list[int]
    last_node: Any
    host_nodes: list[Any] = field(default_factory=list)

    @property
    def prefix_len(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class NodeView:
    """One node of ``TreeView``: what a display of the tree needs, never the KV slots.

    ``prefix_len`` counts the tokens from the root to the end of this node's edge,
    ``num_tokens`` those of the edge itself, ``token_ids`` its first few ids. ``hits``:
    admissions whose cached prefix ran through this node. ``locked``: a running request
    holds it (or a descendant); ``evictable``: not locked, so its slots count as
    evictable. ``tier``: where its K/V lives (``"device"``, the KV pool; ``"host"``, the
    hierarchical cache's host tier).
    """

    node_id: int
    parent_id: int | None
    prefix_len: int
    num_tokens: int
    token_ids: tuple[int, ...]
    hits: int
    locked: bool
    evictable: bool
    num_children: int
    last_access: int
    tier: str = "device"


@dataclass(frozen=True)
class TreeView:
    """A bounded snapshot of a prefix cache: ``nodes`` (the root first, each parent before
    its children) and the totals of the whole cache (``total_tokens`` and its split count
    the device tier; ``host_tokens`` the host tier). ``truncated``: nodes were left out."""

    enabled: bool
    num_nodes: int  # nodes in the whole tree, the root excluded
    total_tokens: int
    evictable_tokens: int
    protected_tokens: int
    nodes: list[NodeView] = field(default_factory=list)
    truncated: bool = False
    host_tokens: int = 0


class BasePrefixCache(ABC):
    """Contract shared by the radix tree and its no-sharing twin."""

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int], count_hit: bool = True) -> MatchResult:
        """Longest cached prefix of ``token_ids``; touches its nodes for LRU.

        Matches may end inside an edge: the tree splits the node so that the returned
        handle covers exactly the matched tokens. ``count_hit``: the match serves a
        request (its nodes' hit counts, which LFU and ``view`` read, go up); False for a
        re-match of the caller's own bookkeeping.
        """

    @abstractmethod
    def insert(self, token_ids: Sequence[int], slots: Sequence[int]) -> int:
        """Add ``token_ids`` (with ``len(slots) == len(token_ids)``) to the cache.

        Returns how many leading tokens were already cached. Afterwards the cache owns
        exactly the slots that a following ``match_prefix(token_ids)`` returns (all of them
        for the radix tree, none for the no-sharing twin); the caller keeps the rest and
        frees its duplicates ``slots[its_cached_prefix_len:returned]``.
        """

    @abstractmethod
    def continuation(self, token_ids: Sequence[int], max_len: int,
                     cursor: ContinuationCursor | None = None) -> list[int]:
        """What the cached sequences say comes after ``token_ids``: up to ``max_len`` tokens
        that follow them on a cached path, or [] when no cached sequence extends all of
        ``token_ids`` (the no-sharing twin: always []).

        Where cached sequences branch after the match, the most recently used branch is
        followed. Read-only: no split, no access-time or hit-count change, no lock, so a query
        never changes what is evicted. The answer is a suggestion read at call time (the
        tree may evict it right after); it holds no slot. ``cursor`` (a
        ``ContinuationCursor`` kept per growing sequence) makes the cost of repeated
        queries proportional to the tokens appended since the last one.
        """

    @abstractmethod
    def lock(self, node: Any) -> None:
        """Protect ``node`` and every ancestor from eviction (reference count +1)."""

    @abstractmethod
    def unlock(self, node: Any) -> None:
        """Undo one ``lock`` of ``node``."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots from least-recently-used unlocked leaves,
        if that many are evictable. Returns how many were freed."""

    @property
    @abstractmethod
    def evictable_size(self) -> int:
        """Slots owned by the cache and not protected by any lock."""

    @property
    @abstractmethod
    def protected_size(self) -> int:
        """Slots owned by the cache and protected by at least one lock."""

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    @abstractmethod
    def all_slots(self) -> list[int]:
        """Every slot the cache owns (for integrity checks)."""

    @abstractmethod
    def reset(self) -> None:
        """Drop everything without freeing (the pool is reset alongside)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if internal bookkeeping is inconsistent."""

    def view(self, max_nodes: int, max_ids: int = 16) -> TreeView:
        """At most ``max_nodes`` nodes (``max_nodes >= 1``; the root is one) for display,
        each with at most ``max_ids`` token ids. Reads only: no split, no touch. Cost: the
        nodes returned and the children looked at, never the whole tree. This default
        shows a cache without a tree: its root alone."""
        root = NodeView(0, None, 0, 0, (), 0, False, True, 0, 0)
        return TreeView(False, 0, self.total_size, self.evictable_size,
                        self.protected_size, [root])

    def pretty_print(self) -> str:
        return f"{type(self).__name__}(total={self.total_size})"
