"""The tiered radix tree (radix/hiradix.py) on fake stores, no torch: eviction moves leaves
to the host tier, a match promotes them back with the K/V they had, LRU runs across the
tiers, and every slot of both tiers stays accounted for.

A slot's "K/V" here is a value that depends on the whole prefix up to its token (as real
K/V does), so a slot moved to the wrong place or a stale copy shows as a wrong value."""

from __future__ import annotations

import random

import pytest

from radixlm.radix import DEVICE, HOST, HiRadixCache, create_prefix_cache


def kv_of(tokens: list[int], i: int) -> int:
    return hash(tuple(tokens[: i + 1]))


class FakeHost:
    """A host store with ``capacity`` slots, copying from the fake device pool."""

    def __init__(self, capacity: int, device: dict[int, int]) -> None:
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))
        self.data: dict[int, int] = {}
        self.device = device
        self.copies = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def demote(self, slots: list[int]) -> list[int] | None:
        if len(slots) > len(self._free):
            return None
        host = [self._free.pop() for _ in slots]
        for h, s in zip(host, slots):
            self.data[h] = self.device[s]
        self.copies += len(slots)
        return host

    def free(self, host_slots: list[int]) -> None:
        for h in host_slots:
            del self.data[h]
            self._free.append(h)


class Pool:
    """Fake device pool: a free list and the K/V value each used slot holds."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free_list = list(range(capacity))
        self.kv: dict[int, int] = {}

    def free(self, slots: list[int]) -> None:
        for s in slots:
            self.kv.pop(s, None)
        self.free_list.extend(slots)


class Manager:
    """What KVManager does with the tree, in a few lines: match, lock, promote the host
    part, compute the rest, insert, unlock."""

    def __init__(self, capacity: int, host_capacity: int) -> None:
        self.pool = Pool(capacity)
        self.host = FakeHost(host_capacity, self.pool.kv)
        self.cache = HiRadixCache(self.pool.free, self.host)
        self.computed = 0  # tokens whose K/V had to be computed

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.pool.free_list):
            self.cache.evict(n - len(self.pool.free_list))
        if n > len(self.pool.free_list):
            return None
        out = self.pool.free_list[-n:] if n else []
        del self.pool.free_list[len(self.pool.free_list) - n:]
        return out

    def serve(self, tokens: list[int]) -> tuple[int, int]:
        """One request over ``tokens``: (device hits, host hits). Checks the K/V of the
        whole matched prefix against what recomputing it would give."""
        cache = self.cache
        m = cache.match_prefix(tokens)
        cache.lock(m.last_node)
        node, slots = m.last_node, list(m.slots)
        device_hit = len(slots)
        need = sum(len(h.key) for h in m.host_nodes)
        new = self.alloc(need) if need else []
        used = 0
        if new is not None:
            for h in m.host_nodes:
                if h.dead:
                    break
                part = new[used:used + len(h.key)]
                for hs, ds in zip(h.slots, part):
                    self.pool.kv[ds] = self.host.data[hs]
                cache.promote(h, part)
                used += len(part)
                cache.lock(h)
                cache.unlock(node)
                node = h
            self.pool.free(new[used:])
            slots += new[:used]
        for i, s in enumerate(slots):
            assert self.pool.kv[s] == kv_of(tokens, i), f"wrong K/V at {i}"
        rest = self.alloc(len(tokens) - len(slots))
        assert rest is not None
        for i, s in enumerate(rest, start=len(slots)):
            self.pool.kv[s] = kv_of(tokens, i)
        self.computed += len(rest)
        owned = len(slots)
        slots += rest
        already = cache.insert(tokens, slots)
        if already > owned:
            self.pool.free(slots[owned:already])
        cache.unlock(node)
        cache.check_integrity()
        self.check_accounting()
        return device_hit, used

    def check_accounting(self) -> None:
        cache = self.cache
        assert len(self.pool.free_list) + cache.total_size == self.pool.capacity
        assert sorted(self.pool.free_list + cache.all_slots()) == list(range(self.pool.capacity))
        assert cache.host_size + self.host.num_free == self.host.capacity
        assert len(self.host.data) == cache.host_size


def seq(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def test_eviction_moves_a_leaf_to_the_host_tier_and_a_match_brings_it_back():
    m = Manager(capacity=64, host_capacity=256)
    a, b = seq(1, 40), seq(2, 40)
    m.serve(a)
    m.serve(b)  # 80 tokens in a 64-slot pool: a (least recent) moves to the host tier
    view = {n.tier for n in m.cache.view(16).nodes[1:]}
    assert view == {DEVICE, HOST}
    assert m.cache.host_size == 40 and m.cache.demoted_tokens == 40
    before = m.computed
    device_hit, host_hit = m.serve(a)  # promoted, not recomputed
    assert (device_hit, host_hit) == (0, 40)
    assert m.computed == before
    assert m.cache.promoted_tokens == 40


def test_partial_match_splits_a_host_node_and_promotes_only_the_matched_part():
    m = Manager(capacity=64, host_capacity=256)
    a = seq(3, 50)
    m.serve(a)
    m.serve(seq(4, 50))  # a -> host
    query = a[:30] + seq(5, 10)
    device_hit, host_hit = m.serve(query)
    assert host_hit == 30 and device_hit == 0
    tiers = sorted((n.prefix_len, n.tier) for n in m.cache.view(16).nodes[1:])
    assert (30, DEVICE) in tiers  # the matched head is on the device now
    assert (50, HOST) in tiers  # the rest of the edge stayed on the host


def test_lru_across_tiers_drops_the_least_recent_host_leaf():
    m = Manager(capacity=32, host_capacity=64)
    seqs = [seq(10 + i, 30) for i in range(4)]
    for s in seqs:
        m.serve(s)
    # 120 tokens through 32 device + 64 host slots: the oldest was dropped from the host
    assert m.cache.host_evicted_tokens == 30
    assert m.serve(seqs[0]) == (0, 0)  # gone from both tiers: recomputed
    assert m.serve(seqs[3]) == (0, 30)  # on the host tier: promoted


def test_insert_over_host_nodes_takes_the_fresh_slots():
    """A request that computed tokens a host node also holds (it matched before they were
    demoted) gives the tree its own slots for them: the node is on the device again."""
    m = Manager(capacity=64, host_capacity=256)
    cache, a = m.cache, seq(20, 40)
    m.serve(a)
    m.serve(seq(21, 40))  # a -> host
    assert cache.host_size == 40
    slots = m.alloc(40)  # evicts the other sequence to the host tier
    for i, s in enumerate(slots):
        m.pool.kv[s] = kv_of(a, i)
    assert cache.insert(a, slots) == 0  # nothing was on the device: no duplicates
    match = cache.match_prefix(a)
    assert match.slots == slots and match.host_nodes == []
    assert cache.host_size == 40  # only the other sequence is left there
    cache.check_integrity()
    m.check_accounting()


def test_a_node_too_large_for_the_host_tier_is_dropped_with_its_host_subtree():
    m = Manager(capacity=64, host_capacity=16)
    m.serve(seq(30, 40))
    m.serve(seq(31, 40))
    assert m.cache.host_size == 0 and m.cache.dropped_tokens == 40


def test_host_nodes_cannot_be_locked_and_promote_checks_its_arguments():
    m = Manager(capacity=64, host_capacity=256)
    a = seq(40, 40)
    m.serve(a)
    m.serve(seq(41, 40))
    match = m.cache.match_prefix(a)
    (host_node,) = match.host_nodes
    with pytest.raises(ValueError, match="host tier"):
        m.cache.lock(host_node)
    with pytest.raises(ValueError, match="slots for a node"):
        m.cache.promote(host_node, [1, 2])
    with pytest.raises(ValueError, match="not a host node"):
        m.cache.promote(match.last_node, [])


def test_flush_host_and_reset_give_every_host_slot_back():
    m = Manager(capacity=32, host_capacity=128)
    for i in range(5):
        m.serve(seq(50 + i, 30))
    assert m.cache.host_size > 0
    assert m.cache.flush_host() > 0
    assert m.cache.host_size == 0 and m.host.num_free == m.host.capacity
    m.cache.check_integrity()
    for i in range(5):
        m.serve(seq(60 + i, 30))
    device = m.cache.all_slots()
    m.cache.reset()
    m.pool.free(device)
    assert m.host.num_free == m.host.capacity and not m.host.data
    m.cache.check_integrity()


def test_a_host_tier_needs_the_radix_cache():
    with pytest.raises(ValueError, match="radix cache"):
        create_prefix_cache(lambda s: None, disable_radix_cache=True,
                            host=FakeHost(8, {}))


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_keeps_kv_and_accounting_right(seed):
    """Agent-style traffic: a few templates, each with many continuations, through a pool
    far smaller than the working set. Every match's K/V is checked, both tiers'
    accounting after every request; the host tier must save recomputation."""
    rng = random.Random(seed)
    templates = [seq(100 * seed + t, rng.randint(20, 60)) for t in range(6)]
    m = Manager(capacity=96, host_capacity=rng.choice([0, 64, 256, 1024]))
    plain = Manager(capacity=96, host_capacity=0)
    for _ in range(120):
        t = rng.choice(templates)
        cut = rng.randint(1, len(t))
        tokens = t[:cut] + seq(rng.randrange(10**6), rng.randint(1, 30))
        m.serve(tokens)
        plain.serve(tokens)
    if m.host.capacity >= 256:
        assert m.computed < plain.computed
