"""Waiting-queue ordering and in-batch prefix dedup. Pure Python.

``lpm`` (longest prefix match) puts the requests with the most cached prefix first, so
what is cached is used before it is evicted; past ``LPM_MAX_QUEUE`` waiting requests the
matching costs more than it saves and the order falls back to FCFS, as SGLang does.
"""

from __future__ import annotations

from radixlm.radix.base import BasePrefixCache
from radixlm.runtime.request import Req

LPM_MAX_QUEUE = 128
# A waiting request that shares at least this many uncached tokens with one already
# picked for the current batch waits one step, then finds them cached.
DEDUP_MIN_SHARED = 32


def order_waiting(waiting: list[Req], policy: str,
                  cache: BasePrefixCache) -> list[tuple[Req, int | None]]:
    """The waiting queue in the order admission should try it (stable), each request with
    its cached prefix length when the policy computed it (None under FCFS)."""
    if policy == "priority":
        return [(r, None) for r in order_by_priority(waiting)]
    if policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE:
        return [(r, None) for r in waiting]
    hits = [(r, cache.cached_prefix_len(r.fill_slice(0, r.max_cacheable_prefix)))
            for r in waiting]
    return sorted(hits, key=lambda item: -item[1])


def shares_uncached_prefix(req: Req, picked: list[Req], cache: BasePrefixCache,
                           cached: int | None = None) -> bool:
    """True when ``req`` would recompute a prefix that a request already picked for this
    batch is computing now (so it should wait a step and hit the cache instead).
    ``cached``: its cached prefix length if known (picks this step do not change it)."""
    if not picked:
        return False
    fill = req.fill_slice(0, req.max_cacheable_prefix)
    end = (cache.cached_prefix_len(fill) if cached is None else cached) + DEDUP_MIN_SHARED
    if end > len(fill):
        return False
    head = fill[:end]  # slice comparisons run in C; no per-token Python loop
    return any(other.fill_slice(0, end) == head for other in picked)


def priority_key(req: Req) -> tuple[int, int]:
    """Sort key of the priority policy: higher priority first, then arrival order (``uid``
    is given at creation and kept through retraction, so a retracted request keeps its
    place among its equals)."""
    return (-req.priority, req.uid)


def order_by_priority(reqs: list[Req]) -> list[Req]:
    """Highest priority first, first come first served within a priority."""
    return sorted(reqs, key=priority_key)


def preemption_victim(req: Req, running: list[Req], threshold: int) -> Req | None:
    """The running request to retract so that waiting ``req`` can run: the lowest-priority
    (then latest-arrived) one whose priority is below ``req.priority - threshold``; None if
    no running request is outranked by that much."""
    outranked = [r for r in running if r.priority < req.priority - threshold]
    return max(outranked, key=priority_key, default=None)
