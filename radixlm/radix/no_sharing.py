"""The prefix cache with sharing turned off: same interface as ``RadixCache``, owns nothing.

Used when the radix cache is disabled, so that the scheduler runs the very same calls and
benchmarks compare cache on and off like for like.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixlm.radix.base import BasePrefixCache, FreeSlotsFn, MatchResult
from radixlm.radix.continuation import ContinuationCursor


class _NoSharingRoot:
    """The one handle ``NoSharingCache.match_prefix`` returns (it covers zero tokens)."""

    __slots__ = ("locks",)

    def __init__(self) -> None:
        self.locks = 0

    def __repr__(self) -> str:
        return f"NoSharingRoot(locks={self.locks})"


class NoSharingCache(BasePrefixCache):
    """A cache that never shares and never owns a slot.

    Semantics, chosen so that the scheduler's calling protocol is identical for both caches:

    - ``match_prefix`` always returns no slots and the root handle (``prefix_len == 0``).
    - ``insert`` validates its arguments and returns 0 ("nothing was already cached"), but
      takes ownership of *nothing*: the slots stay with the request. Under the protocol the
      scheduler frees ``slots[prefix_len:returned]`` (here ``slots[0:0]``, nothing) and then
      re-matches; the re-match returns zero slots, so the request still owns all of its
      slots and frees them when it finishes. (The general rule for both caches: after
      ``insert``, the cache owns exactly the slots a ``match_prefix`` of the same tokens
      returns.)
    - ``lock`` / ``unlock`` count locks on the root handle (to catch unbalanced unlocks);
      ``evict`` frees nothing; every size is 0. ``free_slots`` is accepted for interface
      symmetry and never called.
    """

    def __init__(self, free_slots: FreeSlotsFn, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._free_slots = free_slots
        self.page_size = page_size
        self._root = _NoSharingRoot()

    def match_prefix(self, token_ids: Sequence[int], count_hit: bool = True) -> MatchResult:
        return MatchResult(slots=[], last_node=self._root)

    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        return 0

    def insert(self, token_ids: Sequence[int], slots: Sequence[int]) -> int:
        """Take nothing and report nothing cached; see the class docstring."""
        if len(token_ids) != len(slots):
            raise ValueError(f"{len(token_ids)} token ids but {len(slots)} slots")
        if len(token_ids) % self.page_size:
            raise ValueError(f"insert length {len(token_ids)} is not a multiple of page_size")
        return 0

    def continuation(self, token_ids: Sequence[int], max_len: int,
                     cursor: ContinuationCursor | None = None) -> list[int]:
        """Nothing is cached, so nothing continues: always []."""
        return []

    def _check_handle(self, node: object) -> None:
        if node is not self._root:
            raise ValueError(f"stale or foreign cache handle: {node!r}")

    def lock(self, node: _NoSharingRoot) -> None:
        self._check_handle(node)
        node.locks += 1

    def unlock(self, node: _NoSharingRoot) -> None:
        self._check_handle(node)
        if node.locks <= 0:
            raise ValueError("unlock without a matching lock")
        node.locks -= 1

    def evict(self, num_tokens: int) -> int:
        return 0

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def all_slots(self) -> list[int]:
        return []

    def reset(self) -> None:
        """Start afresh; handles given out before become invalid."""
        self._root = _NoSharingRoot()

    def check_integrity(self) -> None:
        assert self._root.locks >= 0, "negative lock count"

    def pretty_print(self) -> str:
        return f"NoSharingCache(total=0, locks={self._root.locks})"
