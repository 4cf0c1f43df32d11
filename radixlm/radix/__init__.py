"""Prefix caching over token ids: the radix tree and its no-sharing twin.

Pure Python, no torch. See ``base.py`` for the slot-ownership contract.
"""

from __future__ import annotations

from radixlm.radix.base import BasePrefixCache, FreeSlotsFn, MatchResult, NodeView, TreeView
from radixlm.radix.continuation import ContinuationCursor
from radixlm.radix.no_sharing import NoSharingCache
from radixlm.radix.radix_cache import EvictionPolicy, RadixCache, TreeNode


def create_prefix_cache(
    free_slots: FreeSlotsFn,
    *,
    disable_radix_cache: bool = False,
    eviction_policy: EvictionPolicy = "lru",
    page_size: int = 1,
) -> BasePrefixCache:
    """The cache the scheduler should use: ``RadixCache``, or ``NoSharingCache`` if disabled."""
    if disable_radix_cache:
        return NoSharingCache(free_slots, page_size=page_size)
    return RadixCache(free_slots, eviction_policy=eviction_policy, page_size=page_size)


__all__ = [
    "BasePrefixCache",
    "ContinuationCursor",
    "EvictionPolicy",
    "FreeSlotsFn",
    "MatchResult",
    "NoSharingCache",
    "NodeView",
    "RadixCache",
    "TreeNode",
    "TreeView",
    "create_prefix_cache",
]
