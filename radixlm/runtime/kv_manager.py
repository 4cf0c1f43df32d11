"""Moves KV slots between the free list, the prefix cache and requests. Pure Python.

Every usable slot is in exactly one place: the allocator's free list, the prefix cache, or
a request (``req.kv_slots[req.cache_owned_len:]``). ``check_integrity`` verifies it.

With cache tiers (``hicache.CacheTiers``) the cache is the tiered radix tree: eviction
moves nodes to the host tier, and admission brings a matched prefix back from the host
tier (``_promote``) and then from disk (``_load_storage``) before computing the rest;
every prefix the cache takes is written through to disk in whole blocks.
"""

from __future__ import annotations

from radixlm.radix import HOST, create_prefix_cache
from radixlm.runtime.kv_pool import RowAllocator, SlotAllocator
from radixlm.runtime.request import Req

FLUSH_TIERS = ("device", "host", "storage")


class KVManager:
    def __init__(self, capacity: int, num_rows: int, disable_radix_cache: bool,
                 eviction_policy: str = "lru", tiers=None) -> None:
        """``tiers``: a ``hicache.CacheTiers`` (hierarchical cache), or None."""
        self.slots = SlotAllocator(capacity)
        self.rows = RowAllocator(num_rows)
        self.tiers = tiers
        self.cache = create_prefix_cache(self.slots.free, disable_radix_cache=disable_radix_cache,
                                         eviction_policy=eviction_policy,
                                         host=tiers.host if tiers is not None else None)
        self.evicted_total = 0  # tokens evicted from the cache to make room
        # the last admission's cached prefix by tier: device, host, storage
        self.last_hits: dict[str, int] = {}

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
        tokens = req.fill_slice(0, max_prefix)
        match = self.cache.match_prefix(tokens)
        self.cache.lock(match.last_node)
        req.row, req.row_synced = row, 0
        req.kv_slots = list(match.slots)
        req.cache_node, req.cache_owned_len = match.last_node, len(match.slots)
        if self.tiers is not None:
            hits = {"device": len(match.slots), "host": self._promote(req, match.host_nodes),
                    "storage": self._load_storage(req, max_prefix)}
            for tier, n in hits.items():
                self.tiers.hit_tokens[tier] += n
            self.last_hits = hits
        return True

    def _promote(self, req: Req, host_nodes: list) -> int:
        """Bring the host-tier part of ``req``'s match to the device: slots allocated
        (evicting elsewhere; the matched device path is locked), written from the host
        store, given to the tree; ``req`` then holds the longer prefix. Returns its tokens."""
        need = sum(len(node.key) for node in host_nodes)
        new = self.alloc(need) if need else None
        if new is None:
            return 0
        used = 0
        for node in host_nodes:  # making room may have dropped the deepest ones
            if node.dead or node.tier != HOST:
                break
            part = new[used:used + len(node.key)]
            self.tiers.host.load(node.slots, part)
            self.cache.promote(node, part)
            used += len(part)
        self.slots.free(new[used:])
        if used:
            self._relock(req, req.kv_len + used)
        return used

    def _load_storage(self, req: Req, max_prefix: int) -> int:
        """Extend ``req``'s cached prefix towards ``max_prefix`` with blocks from disk
        (written into new slots and given to the tree). Returns the tokens loaded."""
        start, stop = req.kv_len, min(max_prefix, req.fill_len)
        tokens = req.fill_ids  # blocks are keyed by whole blocks, also past max_prefix
        first, keys = self.tiers.storage_run(tokens, start, stop)
        if not keys:
            return 0
        block = self.tiers.block_tokens
        new = self.alloc(min((first + len(keys)) * block, stop) - start)
        if new is None:
            return 0
        loaded = self.tiers.load_storage(tokens, first, keys, start, stop, new)
        self.slots.free(new[loaded:])
        if loaded:
            already = self.cache.insert(tokens[:start + loaded], req.kv_slots + new[:loaded])
            assert already == start, f"the tree held {already} tokens, {start} were matched"
            self._relock(req, start + loaded)
        return loaded

    def _relock(self, req: Req, length: int) -> None:
        """``req`` (admitted, holding only cached slots) takes the cache's first ``length``
        tokens of its sequence: locked, and its slots."""
        match = self.cache.match_prefix(req.fill_slice(0, length), count_hit=False)
        assert len(match.slots) == length, f"{len(match.slots)} of {length} tokens cached"
        self.cache.lock(match.last_node)
        self.cache.unlock(req.cache_node)
        req.kv_slots = list(match.slots)
        req.cache_node, req.cache_owned_len = match.last_node, length

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
        if self.tiers is not None:
            self.tiers.write_through(tokens, match.slots)
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
            owned = self.cache.match_prefix(tokens, count_hit=False).slots
            owned_from = len(owned)
            if self.tiers is not None:
                self.tiers.write_through(tokens, owned)
        self.slots.free(req.kv_slots[max(owned_from, req.cache_owned_len):])
        self.cache.unlock(req.cache_node)
        self.rows.free(req.row)
        req.row, req.cache_node, req.kv_slots = None, None, []
        req.cache_owned_len, req.row_synced = 0, 0

    # ------------------------------------------------------------------ admin
    def flush(self, tier: str | None, busy: bool) -> bool:
        """Empty the cache (``tier`` None: every tier) or one tier: ``"device"`` (its
        prefixes leave the KV pool as eviction would: to the host tier if there is one),
        ``"host"`` or ``"storage"``. The device (and a full flush) refuses while requests
        hold K/V or wait (``busy``): False. ValueError for a tier this cache lacks."""
        if tier is not None and tier not in FLUSH_TIERS:
            raise ValueError(f"unknown cache tier {tier!r} (one of {', '.join(FLUSH_TIERS)})")
        tiers = self.tiers
        if tier in ("host", "storage") and (
                tiers is None or (tier == "storage" and tiers.storage is None)):
            raise ValueError(f"this engine has no {tier} tier (see --enable-hierarchical-cache"
                             f"{' and --hicache-storage-backend' if tier == 'storage' else ''})")
        if tier == "host":
            self.cache.flush_host()
            return True
        if tier == "storage":
            tiers.flush_storage()
            return True
        if busy:
            return False
        if tier == "device":
            self.evicted_total += self.cache.evict(self.cache.evictable_size)
            return True
        freed = self.cache.all_slots()
        self.cache.reset()
        self.slots.free(freed)
        if tiers is not None:
            tiers.flush_storage()
        return True

    def tier_stats(self) -> dict | None:
        return self.tiers.stats(self.cache) if self.tiers is not None else None

    def close(self) -> None:
        """Finish the tiers' background work (writes queued for disk)."""
        if self.tiers is not None:
            self.tiers.close()

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
        if self.tiers is not None:  # the host store's slots: free or held by host nodes
            host = self.tiers.host
            held = self.cache.host_slots()
            every = host.free_slots() + held
            assert len(every) == host.capacity == len(set(every)), (
                f"host slots: {len(host.free_slots())} free + {len(held)} held != "
                f"{host.capacity}")
