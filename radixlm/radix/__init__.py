"""Prefix caching over token ids: the radix tree, its tiered variant (a host tier below the
KV pool, ``hiradix.py``) and its no-sharing twin.

Pure Python, no torch. See ``base.py`` for the slot-ownership contract.
"""

from __future__ import annotations

from radixlm.radix.base import (
    DEVICE,
    HOST,
    BasePrefixCache,
    FreeSlotsFn,
    HostStore,
    MatchResult,
    NodeView,
    TreeView,
)
from radixlm.radix.continuation import ContinuationCursor
from radixlm.radix.hiradix import HiRadixCache
from radixlm.radix.no_sharing import NoSharingCache
from radixlm.radix.radix_cache import EvictionPolicy, RadixCache, TreeNode


def create_prefix_cache(
    free_slots: FreeSlotsFn,
    *,
    disable_radix_cache: bool = False,
    eviction_policy: EvictionPolicy = "lru",
    page_size: int = 1,
    host: HostStore | None = None,
) -> BasePrefixCache:
    """The cache the scheduler should use: ``RadixCache`` (``HiRadixCache`` with a host
    tier's store ``host``), or ``NoSharingCache`` if disabled."""
    if disable_radix_cache:
        if host is not None:
            raise ValueError("a host tier needs the radix cache (it is disabled)")
        return NoSharingCache(free_slots, page_size=page_size)
    if host is not None:
        return HiRadixCache(free_slots, host, eviction_policy=eviction_policy,
                            page_size=page_size)
    return RadixCache(free_slots, eviction_policy=eviction_policy, page_size=page_size)


__all__ = [
    "DEVICE",
    "HOST",
    "BasePrefixCache",
    "ContinuationCursor",
    "EvictionPolicy",
    "FreeSlotsFn",
    "HiRadixCache",
    "HostStore",
    "MatchResult",
    "NoSharingCache",
    "NodeView",
    "RadixCache",
    "TreeNode",
    "TreeView",
    "create_prefix_cache",
]
