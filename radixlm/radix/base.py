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
from dataclasses import dataclass
from typing import Any

from radixlm.radix.continuation import ContinuationCursor

FreeSlotsFn = Callable[[list[int]], None]


@dataclass
class MatchResult:
    """What ``match_prefix`` found.

    ``slots[i]`` is the KV slot holding token ``i`` of the matched prefix. ``last_node``
    is an opaque handle: pass it to ``lock`` / ``unlock``. The slots are only safe to use
    while that handle is locked (an unlocked prefix may be evicted at the next ``evict``).
    """

    slots: list[int]
    last_node: Any

    @property
    def prefix_len(self) -> int:
        return len(self.slots)


class BasePrefixCache(ABC):
    """Contract shared by the radix tree and its no-sharing twin."""

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of ``token_ids``; touches its nodes for LRU.

        Matches may end inside an edge: the tree splits the node so that the returned
        handle covers exactly the matched tokens.
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

    def pretty_print(self) -> str:
        return f"{type(self).__name__}(total={self.total_size})"
