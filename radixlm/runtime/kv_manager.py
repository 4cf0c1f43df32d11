"""Moves KV slots between the free list, the prefix cache and requests. Pure Python.

Every usable slot is in exactly one place: the allocator's free list, the prefix cache, or
a request (``req.kv_slots[req.cache_owned_len:]``). ``check_integrity`` verifies it.
"""

from __future__ import annotations

from radixlm.radix import create_prefix_cache
from radixlm.runtime.kv_pool import RowAllocator, SlotAllocator
from radixlm.runtime.request import Req


class KVManager:
    def __init__(self, capacity: int, num_rows: int, disable_radix_cache: bool,
                 eviction_policy: str = "lru") -> None:
        self.slots = SlotAllocator(capacity)
        self.rows = RowAllocator(num_rows)
        self.cache = create_prefix_cache(self.slots.free, disable_radix_cache=disable_radix_cache,
                                         eviction_policy=eviction_policy)
        self.evicted_total = 0  # tokens evicted from the cache to make room

    @property
    def available(self) -> int:
        """Slots obtainable now: free plus evictable from the cache."""
        return self.slots.num_free + self.cache.evictable_size

    def alloc(self, n: int) -> list[int] | None:
        """``n`` slots, evicting unlocked cache leaves if needed; None if impossible."""
        if n > self.slots.num_free:
            self.evicted_total += self.cache.evict(n - self.slots.num_free)
        return self.slots.alloc(n)

    # ------------------------------------------------------------------ admission
    def admit(self, req: Req, max_prefix: int) -> bool:
        """Give a waiting request a row and its cached prefix (locked). False if no row."""
        row = self.rows.alloc()
        if row is None:
            return False
        match = self.cache.match_prefix(req.fill_slice(0, max_prefix))
        self.cache.lock(match.last_node)
        req.row, req.row_synced = row, 0
        req.kv_slots = list(match.slots)
        req.cache_node, req.cache_owned_len = match.last_node, len(match.slots)
        return True

    def extend(self, req: Req, n: int) -> bool:
        """Allocate slots for the next ``n`` tokens of ``req``."""
        new = self.alloc(n)
        if new is None:
            return False
        req.kv_slots.extend(new)
        return True

    def extend_free(self, req: Req, n: int) -> bool:
        """Allocate slots for ``n`` more tokens of ``req`` from free slots only (a draft:
        it never evicts the cache, and it has no slots unless they are free)."""
        new = self.slots.alloc(n) if n <= self.slots.num_free else None
        if new is None:
            return False
        req.kv_slots.extend(new)
        return True

    def detach(self, req: Req, kv_len: int) -> list[int]:
        """Take the request's own slots past ``kv_len`` out of it, unfreed: the caller
        gives each back in order (``req.kv_slots.append``) or frees it."""
        assert kv_len >= req.cache_owned_len, "detach reaches into the cache's slots"
        taken = req.kv_slots[kv_len:]
        del req.kv_slots[kv_len:]
        req.row_synced = min(req.row_synced, kv_len)
        return taken

    def truncate(self, req: Req, kv_len: int) -> None:
        """Drop the request's own K/V past ``kv_len`` (after a jump-forward rollback)."""
        if kv_len >= req.kv_len:
            return
        if kv_len < req.cache_owned_len:  # keep the cache's slots, lock a shorter prefix
            self.slots.free(req.kv_slots[req.cache_owned_len:])
            match = self.cache.match_prefix(req.fill_slice(0, kv_len), count_hit=False)
            self.cache.lock(match.last_node)
            self.cache.unlock(req.cache_node)
            req.cache_node, req.cache_owned_len = match.last_node, len(match.slots)
            req.kv_slots = list(match.slots)
            req.row_synced = min(req.row_synced, len(match.slots))
            return
        self.slots.free(req.kv_slots[kv_len:])
        del req.kv_slots[kv_len:]
        req.row_synced = min(req.row_synced, kv_len)

    # ------------------------------------------------------------------ caching
    def cache_unfinished(self, req: Req, length: int) -> None:
        """Share the first ``length`` computed tokens of a running request."""
        if length <= req.cache_owned_len:
            return
        tokens = req.fill_slice(0, length)
        already = self.cache.insert(tokens, req.kv_slots[:length])
        if already > req.cache_owned_len:
            self.slots.free(req.kv_slots[req.cache_owned_len:already])
        match = self.cache.match_prefix(tokens, count_hit=False)
        self.cache.lock(match.last_node)
        self.cache.unlock(req.cache_node)
        old_owned = req.cache_owned_len
        req.kv_slots[: len(match.slots)] = match.slots
        req.cache_node, req.cache_owned_len = match.last_node, len(match.slots)
        if already > old_owned:
            req.row_synced = min(req.row_synced, old_owned)

    def release(self, req: Req, insert: bool = True) -> None:
        """A request leaves (finished, aborted or retracted): hand its computed K/V to the
        cache (``insert``) or free it, unlock its prefix and free its row."""
        if req.row is None:
            return
        owned_from = req.cache_owned_len
        if insert and req.kv_len > req.cache_owned_len:
            tokens = req.fill_slice(0, req.kv_len)
            already = self.cache.insert(tokens, req.kv_slots)
            if already > req.cache_owned_len:
                self.slots.free(req.kv_slots[req.cache_owned_len:already])
            owned_from = len(self.cache.match_prefix(tokens, count_hit=False).slots)
        self.slots.free(req.kv_slots[max(owned_from, req.cache_owned_len):])
        self.cache.unlock(req.cache_node)
        self.rows.free(req.row)
        req.row, req.cache_node, req.kv_slots = None, None, []
        req.cache_owned_len, req.row_synced = 0, 0

    def check_counts(self, reqs: list[Req]) -> None:
        """The O(1)-ish part of ``check_integrity`` (run whenever the engine goes idle)."""
        held = sum(r.kv_len - r.cache_owned_len for r in reqs)
        total = self.slots.num_free + self.cache.total_size + held
        assert total == self.slots.usable, f"KV slots leaked: {total} != {self.slots.usable}"

    def check_integrity(self, reqs: list[Req]) -> None:
        """Raise AssertionError unless free + cached + held == usable, slot by slot."""
        self.cache.check_integrity()
        free = self.slots.free_slots()
        cached = self.cache.all_slots()
        held = [s for r in reqs for s in r.kv_slots[r.cache_owned_len:]]
        everything = free + cached + held
        assert len(everything) == self.slots.usable, (
            f"free {len(free)} + cached {len(cached)} + held {len(held)} != {self.slots.usable}")
        assert len(set(everything)) == len(everything), "a slot is in two places"
        assert 0 not in set(everything), "padding slot 0 handed out"
