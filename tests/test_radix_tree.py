"""Radix cache and its no-sharing twin: unit tests, the scheduler's calling protocol, and
stateful property tests over a fake slot pool whose "KV" records the prefix each slot holds.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.radix import (
    BasePrefixCache,
    ContinuationCursor,
    NoSharingCache,
    RadixCache,
    TreeNode,
    create_prefix_cache,
)
from radixlm.radix.radix_cache import _common_prefix_len

# ---------------------------------------------------------------------- fakes + protocol


class FakePool:
    """Slot allocator; ``kv[slot]`` is the token prefix whose last token the slot holds."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free_list = list(range(capacity - 1, -1, -1))
        self.kv: dict[int, tuple[int, ...]] = {}

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free_list):
            return None
        out = [self.free_list.pop() for _ in range(n)]
        return out

    def free(self, slots: list[int]) -> None:
        free_set = set(self.free_list)
        for slot in slots:
            assert 0 <= slot < self.capacity and slot not in free_set, f"double free {slot}"
            free_set.add(slot)
            self.free_list.append(slot)
            self.kv.pop(slot, None)


@dataclass
class FakeReq:
    tokens: list[int]
    slots: list[int]  # slots[i] holds the KV of tokens[i]
    prefix_len: int  # slots[:prefix_len] belong to the cache (locked through ``node``)
    node: Any


def admit(cache: BasePrefixCache, pool: FakePool, tokens: list[int]) -> FakeReq | None:
    """Scheduler admission: match, lock, then allocate (evicting) and "compute" the rest."""
    match = cache.match_prefix(tokens)
    cache.lock(match.last_node)  # before evicting, so the matched prefix survives
    need = len(tokens) - match.prefix_len
    if need > len(pool.free_list):
        cache.evict(need - len(pool.free_list))
    own = pool.alloc(need)
    if own is None:
        cache.unlock(match.last_node)
        return None
    for i, slot in enumerate(own):
        pool.kv[slot] = tuple(tokens[: match.prefix_len + i + 1])
    return FakeReq(list(tokens), match.slots + own, match.prefix_len, match.last_node)


def cache_req(
    cache: BasePrefixCache, pool: FakePool, req: FakeReq, insert_len: int, finished: bool
) -> None:
    """The calling protocol after a prefill chunk (``finished=False``) or on finish."""
    tokens, slots = req.tokens[:insert_len], req.slots[:insert_len]
    already = cache.insert(tokens, slots)
    pool.free(req.slots[req.prefix_len : already])  # our duplicates of what the tree held
    match = cache.match_prefix(tokens, count_hit=False)  # the cache owns exactly match.slots
    if finished:
        cache.unlock(req.node)
        pool.free(req.slots[match.prefix_len :])
        return
    cache.lock(match.last_node)
    cache.unlock(req.node)
    req.slots[: match.prefix_len] = match.slots
    req.prefix_len, req.node = match.prefix_len, match.last_node


def make_radix(page_size: int = 1, policy: str = "lru") -> tuple[RadixCache, list[int]]:
    freed: list[int] = []
    return RadixCache(freed.extend, eviction_policy=policy, page_size=page_size), freed


# ---------------------------------------------------------------------- radix unit tests


def test_empty_match_returns_root_and_root_locks_balance() -> None:
    cache, _ = make_radix()
    match = cache.match_prefix([1, 2, 3])
    assert match.slots == [] and match.prefix_len == 0
    cache.lock(match.last_node)
    cache.unlock(match.last_node)
    with pytest.raises(ValueError):
        cache.unlock(match.last_node)
    assert cache.match_prefix([]).prefix_len == 0
    cache.check_integrity()


def test_insert_returns_already_present_count_and_takes_only_the_rest() -> None:
    cache, _ = make_radix()
    assert cache.insert([1, 2, 3, 4], [10, 11, 12, 13]) == 0
    assert cache.insert([1, 2, 3, 4], [20, 21, 22, 23]) == 4
    assert sorted(cache.all_slots()) == [10, 11, 12, 13]
    assert cache.insert([1, 2, 5, 6], [30, 31, 32, 33]) == 2
    assert sorted(cache.all_slots()) == [10, 11, 12, 13, 32, 33]
    assert cache.insert((1, 2, 5, 6, 7), (40, 41, 42, 43, 44)) == 4  # tuples are fine
    assert cache.total_size == cache.evictable_size == 7
    cache.check_integrity()


def test_match_splits_inside_an_edge_and_handle_covers_exactly_the_match() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    assert cache.num_nodes == 1
    assert cache.cached_prefix_len([1, 2, 3, 9]) == 3
    assert cache.num_nodes == 1  # cached_prefix_len never splits
    match = cache.match_prefix([1, 2, 3, 9])
    assert match.slots == [10, 11, 12]
    assert cache.num_nodes == 2
    assert match.last_node.key == [1, 2, 3]
    assert [child.key for child in match.last_node.children.values()] == [[4, 5]]
    cache.lock(match.last_node)  # protects [1, 2, 3] but not [4, 5]
    assert cache.protected_size == 3 and cache.evictable_size == 2
    cache.check_integrity()
    # Matching at a node boundary does not split again.
    assert cache.match_prefix([1, 2, 3]).last_node is match.last_node
    assert cache.num_nodes == 2


def test_split_keeps_older_handles_valid_and_locked() -> None:
    cache, freed = make_radix()
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    deep = cache.match_prefix([1, 2, 3, 4])
    cache.lock(deep.last_node)
    cache.match_prefix([1, 2, 7])  # splits the locked edge above the handle
    cache.check_integrity()
    assert cache.protected_size == 4
    assert cache.evict(100) == 0 and freed == []
    cache.unlock(deep.last_node)
    assert cache.evict(100) == 4 and sorted(freed) == [10, 11, 12, 13]
    cache.check_integrity()


def test_lock_protects_the_path_and_unlock_releases_it() -> None:
    cache, freed = make_radix()
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [20, 21, 22])  # splits into [1, 2] -> {[3], [4]}
    handle = cache.match_prefix([1, 2, 4]).last_node
    cache.lock(handle)
    assert (cache.protected_size, cache.evictable_size) == (3, 1)
    assert cache.evict(100) == 1 and freed == [12]
    cache.check_integrity()
    cache.unlock(handle)
    assert (cache.protected_size, cache.evictable_size) == (0, 3)
    assert cache.evict(1) == 1 and freed == [12, 22]  # leaf first, whole leaves only
    assert cache.evict(1) == 2 and freed == [12, 22, 10, 11]
    assert cache.total_size == 0
    with pytest.raises(ValueError):
        cache.lock(handle)  # evicted: stale handle
    cache.check_integrity()


def test_evict_frees_whole_leaves_and_cascades_to_parents_in_one_call() -> None:
    cache, freed = make_radix()
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4, 5], [20, 21, 22, 23])  # [1, 2] -> {[3], [4, 5]}
    assert cache.evict(2) == 3 and freed == [12, 22, 23]  # two whole leaves, oldest first
    assert cache.total_size == 2
    assert cache.insert([1, 2, 3], [30, 31, 32]) == 2
    assert cache.evict(2) == 3 and freed[3:] == [32, 10, 11]  # leaf, then its parent
    assert cache.total_size == 0 and cache.evict(5) == 0
    cache.check_integrity()


def test_lru_evicts_least_recently_matched_first() -> None:
    cache, freed = make_radix()
    cache.insert([1, 1], [10, 11])
    cache.insert([2, 2], [20, 21])
    cache.insert([3, 3], [30, 31])
    cache.match_prefix([1, 1])  # now [2, 2] is the oldest
    assert cache.evict(1) == 2 and freed == [20, 21]
    cache.match_prefix([3, 3])
    assert cache.evict(1) == 2 and freed[2:] == [10, 11]
    assert cache.evict(1) == 2 and freed[4:] == [30, 31]
    assert cache.evict(1) == 0


def test_lfu_evicts_least_often_matched_then_oldest() -> None:
    cache, freed = make_radix(policy="lfu")
    cache.insert([1], [10])
    cache.insert([2], [20])
    cache.insert([3], [30])
    for _ in range(3):
        cache.match_prefix([1])
    cache.match_prefix([2])
    cache.match_prefix([3])  # [2] and [3] tie on hits; [2] is older
    assert cache.evict(1) == 1 and freed == [20]
    assert cache.evict(1) == 1 and freed == [20, 30]
    assert cache.evict(1) == 1 and freed == [20, 30, 10]


def test_reset_drops_everything_without_freeing_and_invalidates_handles() -> None:
    cache, freed = make_radix()
    cache.insert([1, 2], [10, 11])
    handle = cache.match_prefix([1, 2]).last_node
    cache.lock(handle)
    cache.reset()
    assert freed == [] and cache.total_size == 0 and cache.all_slots() == []
    assert cache.match_prefix([1, 2]).prefix_len == 0
    with pytest.raises(ValueError):
        cache.unlock(handle)
    cache.check_integrity()


def test_bad_inserts_are_rejected() -> None:
    cache, _ = make_radix(page_size=2)
    with pytest.raises(ValueError):
        cache.insert([1, 2], [10])
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], [10, 11, 12])
    with pytest.raises(ValueError):
        RadixCache(lambda s: None, eviction_policy="fifo")  # type: ignore[arg-type]


def test_pages_round_matches_down_and_split_on_page_boundaries() -> None:
    cache, _ = make_radix(page_size=2)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
    assert cache.cached_prefix_len([1, 2, 3, 4, 5]) == 4
    assert cache.cached_prefix_len([1, 2, 3, 9, 5, 6]) == 2  # mismatch inside page 2
    assert cache.cached_prefix_len([1, 9]) == 0
    match = cache.match_prefix([1, 2, 3, 9])
    assert match.slots == [10, 11] and match.last_node.key == [1, 2]
    assert cache.insert([1, 2, 3, 7], [20, 21, 22, 23]) == 2
    cache.check_integrity()
    assert sorted(cache.all_slots()) == [10, 11, 12, 13, 14, 15, 22, 23]


def test_check_integrity_catches_corruption() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2], [10, 11])
    cache.insert([3, 4], [20, 21])
    node = cache.match_prefix([3, 4]).last_node
    node.slots[0] = 10  # the same slot in two nodes
    with pytest.raises(AssertionError, match="owned twice"):
        cache.check_integrity()
    node.slots[0] = 20
    node.lock_ref = 1  # lock count without a lock
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_pretty_print_shows_the_tree() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [20, 21, 22])
    text = cache.pretty_print()
    assert "total=4" in text and "[1, 2] len=2" in text and "    [4] len=1" in text


@given(
    size=st.integers(1, 300),
    mismatch=st.integers(0, 400),
    start=st.integers(0, 5),
    extra=st.integers(-300, 100),
)
def test_common_prefix_len_agrees_with_a_plain_loop(
    size: int, mismatch: int, start: int, extra: int
) -> None:
    key = list(range(size))
    tokens = [-1] * start + key[: max(0, size + extra)]
    if mismatch < len(tokens) - start:
        tokens[start + mismatch] = -2
    limit, expected = min(len(key), len(tokens) - start), 0
    while expected < limit and key[expected] == tokens[start + expected]:
        expected += 1
    assert _common_prefix_len(key, tokens, start) == expected


def test_match_is_fast_on_a_large_tree() -> None:
    rng = random.Random(0)
    cache, _ = make_radix()
    base = [rng.randrange(50_000) for _ in range(2048)]
    cache.insert(base, list(range(len(base))))
    next_slot = len(base)
    for _ in range(100):  # ~100k tokens, prompts branching off ``base`` at random points
        cut = rng.randrange(len(base))
        prompt = base[:cut] + [rng.randrange(50_000) for _ in range(2048 - cut)]
        slots = list(range(next_slot, next_slot + len(prompt)))
        next_slot += len(prompt) - cache.insert(prompt, slots)
    assert cache.total_size > 90_000 and cache.num_nodes > 150
    query = base[:2000] + [7] * 48
    cache.match_prefix(query)  # split once
    timings = []
    for _ in range(30):
        start = time.perf_counter()
        match = cache.match_prefix(query)
        timings.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert cache.cached_prefix_len(query) == match.prefix_len
        timings.append(time.perf_counter() - start)
    assert match.prefix_len == 2000
    assert sorted(timings)[len(timings) // 2] < 2e-3  # typically ~0.05 ms


# ---------------------------------------------------------------------- no-sharing unit tests


def test_no_sharing_cache_owns_nothing_and_counts_locks() -> None:
    freed: list[int] = []
    cache = NoSharingCache(freed.extend)
    assert cache.insert([1, 2, 3], [10, 11, 12]) == 0
    match = cache.match_prefix([1, 2, 3])
    assert match.slots == [] and match.prefix_len == 0
    assert cache.cached_prefix_len([1, 2, 3]) == 0
    assert cache.total_size == 0 and cache.all_slots() == [] and cache.evict(10) == 0
    cache.lock(match.last_node)
    cache.unlock(match.last_node)
    with pytest.raises(ValueError):
        cache.unlock(match.last_node)
    with pytest.raises(ValueError):
        cache.insert([1, 2], [10])
    cache.reset()
    with pytest.raises(ValueError):
        cache.lock(match.last_node)
    cache.check_integrity()
    assert freed == []


def test_create_prefix_cache_picks_the_implementation() -> None:
    assert isinstance(create_prefix_cache(lambda s: None), RadixCache)
    cache = create_prefix_cache(lambda s: None, disable_radix_cache=True)
    assert isinstance(cache, NoSharingCache)


# ---------------------------------------------------------------------- the calling protocol


@pytest.mark.parametrize("kind", ["radix", "none"])
def test_protocol_two_requests_racing_on_one_prompt(kind: str) -> None:
    pool = FakePool(32)
    cache: BasePrefixCache = create_prefix_cache(pool.free, disable_radix_cache=kind == "none")
    prompt = [5, 6, 7, 8, 9, 10]
    a, b = admit(cache, pool, prompt), admit(cache, pool, prompt)  # both miss: empty tree
    assert a is not None and b is not None and a.prefix_len == b.prefix_len == 0
    cache_req(cache, pool, a, 4, finished=False)  # chunk of a
    cache_req(cache, pool, b, 6, finished=False)  # b finds a's 4 tokens: frees 4 duplicates
    if kind == "radix":
        assert b.slots[:4] == a.slots[:4] and len(pool.free_list) == 32 - 12 + 4
    else:
        assert b.slots[:4] != a.slots[:4] and len(pool.free_list) == 32 - 12
    for req in (a, b):
        for i, slot in enumerate(req.slots):
            assert pool.kv[slot] == tuple(prompt[: i + 1])
    cache_req(cache, pool, a, 6, finished=True)
    cache_req(cache, pool, b, 6, finished=True)
    cache.check_integrity()
    assert len(pool.free_list) + cache.total_size == 32
    assert cache.total_size == (6 if kind == "radix" else 0)
    assert cache.protected_size == 0


def test_view_counts_hits_of_admissions_not_of_bookkeeping_rematches() -> None:
    cache, _ = make_radix()
    pool = FakePool(64)
    first = admit(cache, pool, [1, 2, 3, 4, 5, 6])
    assert first is not None
    cache_req(cache, pool, first, 6, finished=True)  # its re-match counts no hit
    (root, node) = cache.view(10).nodes
    assert (node.parent_id, node.num_tokens, node.hits) == (root.node_id, 6, 0)
    second = admit(cache, pool, [1, 2, 3, 7, 8])  # reuses [1, 2, 3]: the edge splits
    assert second is not None and second.prefix_len == 3
    view = cache.view(10)
    by_len = {n.prefix_len: n for n in view.nodes}
    shared, rest = by_len[3], by_len[6]
    assert (shared.hits, shared.locked, shared.evictable) == (1, True, False)
    assert (rest.parent_id, rest.num_tokens, rest.hits) == (shared.node_id, 3, 0)
    assert rest.evictable and not rest.locked and shared.num_children == 1
    cache_req(cache, pool, second, 5, finished=True)
    view = cache.view(10)
    assert view.num_nodes == 3 and view.protected_tokens == 0 and view.total_tokens == 8
    assert [n.hits for n in view.nodes if n.prefix_len == 3] == [1]
    assert all(n.tier == "device" for n in view.nodes)


def test_view_is_bounded_and_keeps_the_most_recently_used_children() -> None:
    cache, _ = make_radix()
    for first in range(5):  # five children of the root, used in this order
        cache.insert([first, *range(100, 140)], list(range(first * 41, first * 41 + 41)))
    cache.match_prefix([2, 100])  # 2 becomes the most recent (and splits after 100)
    view = cache.view(3, max_ids=4)
    assert view.truncated and view.num_nodes == 6 and len(view.nodes) == 3
    assert [n.token_ids for n in view.nodes[1:]] == [(2, 100), (4, 100, 101, 102)]
    assert view.nodes[2].num_tokens == 41 and view.nodes[1].num_children == 1
    full = cache.view(100, max_ids=0)
    assert not full.truncated and len(full.nodes) == 7
    assert all(n.token_ids == () for n in full.nodes)
    with pytest.raises(ValueError, match="max_nodes"):
        cache.view(0)
    cache.evict(cache.total_size)
    assert cache.num_nodes == 0 and cache.view(5).nodes[0].num_children == 0
    cache.check_integrity()


def test_no_sharing_view_is_the_root_alone() -> None:
    cache = NoSharingCache(lambda slots: None)
    cache.insert([1, 2, 3], [0, 1, 2])
    view = cache.view(10)
    assert not view.enabled and view.num_nodes == 0 and len(view.nodes) == 1
    assert view.total_tokens == 0 and not view.truncated


# ---------------------------------------------------------------------- stateful properties

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=10)


class CacheMachine(RuleBasedStateMachine):
    """Random admissions, prefill chunks, decode steps, finishes, pins, probes and evictions.

    Every slot must be in exactly one place: the free list, the cache, or a running request
    (its ``slots[prefix_len:]``); and every slot the cache or a request uses must hold the
    KV of the right prefix.
    """

    capacity = 40

    def make_cache(self, free_slots: Any) -> BasePrefixCache:
        return RadixCache(free_slots)

    def __init__(self) -> None:
        super().__init__()
        self.pool = FakePool(self.capacity)
        self.cache = self.make_cache(self._free_from_cache)
        self.page = getattr(self.cache, "page_size", 1)
        self.reqs: list[FakeReq] = []
        self.pins: list[tuple[Any, list[int]]] = []

    def _protected_slots(self) -> set[int]:
        used = {slot for req in self.reqs for slot in req.slots}
        return used | {slot for _, slots in self.pins for slot in slots}

    def _free_from_cache(self, slots: list[int]) -> None:
        assert not set(slots) & self._protected_slots(), "evicted a locked or running slot"
        self.pool.free(slots)

    def _aligned(self, n: int) -> int:
        return n - n % self.page

    @rule(tokens=TOKENS)
    def admit(self, tokens: list[int]) -> None:
        req = admit(self.cache, self.pool, tokens)
        if req is not None:
            self.reqs.append(req)

    @precondition(lambda self: self.reqs)
    @rule(index=st.integers(0, 99), cut=st.integers(0, 99))
    def prefill_chunk(self, index: int, cut: int) -> None:
        req = self.reqs[index % len(self.reqs)]
        lengths = range(req.prefix_len + self.page, len(req.tokens) + 1, self.page)
        if lengths:
            cache_req(self.cache, self.pool, req, lengths[cut % len(lengths)], finished=False)

    @precondition(lambda self: self.reqs)
    @rule(index=st.integers(0, 99), token=st.integers(0, 3))
    def decode(self, index: int, token: int) -> None:
        req = self.reqs[index % len(self.reqs)]
        if not self.pool.free_list:
            self.cache.evict(1)
        slot = self.pool.alloc(1)
        if slot is not None:
            req.tokens.append(token)
            req.slots += slot
            self.pool.kv[slot[0]] = tuple(req.tokens)

    @precondition(lambda self: self.reqs)
    @rule(index=st.integers(0, 99))
    def finish(self, index: int) -> None:
        req = self.reqs.pop(index % len(self.reqs))
        cache_req(self.cache, self.pool, req, self._aligned(len(req.tokens)), finished=True)

    @rule(tokens=TOKENS)
    def probe(self, tokens: list[int]) -> None:
        expected = self.cache.cached_prefix_len(tokens)
        match = self.cache.match_prefix(tokens)
        assert match.prefix_len == expected and match.prefix_len % self.page == 0
        assert [self.pool.kv[s] for s in match.slots] == [
            tuple(tokens[: i + 1]) for i in range(match.prefix_len)
        ]

    @rule(tokens=TOKENS)
    def pin(self, tokens: list[int]) -> None:
        match = self.cache.match_prefix(tokens)
        self.cache.lock(match.last_node)
        self.pins.append((match.last_node, match.slots))

    @precondition(lambda self: self.pins)
    @rule(index=st.integers(0, 99))
    def unpin(self, index: int) -> None:
        node, _ = self.pins.pop(index % len(self.pins))
        self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 50))
    def evict(self, num_tokens: int) -> None:
        before = self.cache.evictable_size
        freed = self.cache.evict(num_tokens)
        assert freed >= min(num_tokens, before) and freed <= before
        assert self.cache.evictable_size == before - freed

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        cache = self.cache
        cache.check_integrity()
        cached = cache.all_slots()
        assert cache.evictable_size + cache.protected_size == cache.total_size == len(cached)
        owned = [slot for req in self.reqs for slot in req.slots[req.prefix_len :]]
        everything = self.pool.free_list + cached + owned
        assert sorted(everything) == list(range(self.capacity)), "a slot lost or duplicated"
        cached_set = set(cached)
        for req in self.reqs:
            assert set(req.slots[: req.prefix_len]) <= cached_set, "locked prefix evicted"
            for i, slot in enumerate(req.slots):
                assert self.pool.kv[slot] == tuple(req.tokens[: i + 1])
        for _, slots in self.pins:
            assert set(slots) <= cached_set, "pinned prefix evicted"

    @invariant()
    def view_shows_the_tree(self) -> None:
        """The full view is the tree (sizes, prefixes, locks); a bounded one its top."""
        cache = self.cache
        full = cache.view(10**6, max_ids=10**6)
        nodes = {n.node_id: n for n in full.nodes}
        assert full.nodes[0].parent_id is None and not full.truncated
        assert len(full.nodes) == 1 + full.num_nodes
        assert full.num_nodes == getattr(cache, "num_nodes", 0)
        prefixes: dict[int, tuple[int, ...]] = {full.nodes[0].node_id: ()}
        for n in full.nodes[1:]:
            assert n.parent_id in prefixes, "a child before its parent"
            prefixes[n.node_id] = prefixes[n.parent_id] + n.token_ids
            assert n.prefix_len == nodes[n.parent_id].prefix_len + n.num_tokens
            assert cache.cached_prefix_len(list(prefixes[n.node_id])) == n.prefix_len
            assert n.locked != n.evictable
        assert sum(n.num_tokens for n in full.nodes) == cache.total_size == full.total_tokens
        assert sum(n.num_tokens for n in full.nodes if n.locked) == cache.protected_size
        assert sum(n.num_tokens for n in full.nodes if n.evictable) == cache.evictable_size
        for k in (1, 2, 3):
            part = cache.view(k, max_ids=1)
            assert len(part.nodes) == min(k, len(full.nodes))
            assert part.truncated == (k < len(full.nodes))
            seen = {part.nodes[0].node_id}
            for n in part.nodes[1:]:
                assert n.parent_id in seen and len(n.token_ids) == 1
                seen.add(n.node_id)

    @invariant()
    def tree_maps_prefixes_to_their_kv(self) -> None:
        root = getattr(self.cache, "_root", None)
        stack = [(child, ()) for child in getattr(root, "children", {}).values()]
        while stack:
            node, prefix = stack.pop()
            assert isinstance(node, TreeNode)
            for token, slot in zip(node.key, node.slots, strict=True):
                prefix = (*prefix, token)
                assert self.pool.kv[slot] == prefix
            stack.extend((child, prefix) for child in node.children.values())

    def teardown(self) -> None:
        while self.reqs:
            self.finish(0)
        while self.pins:
            self.unpin(0)
        assert self.cache.protected_size == 0
        self.cache.evict(self.cache.total_size)
        assert self.cache.total_size == 0
        assert sorted(self.pool.free_list) == list(range(self.capacity))


class LfuPagedCacheMachine(CacheMachine):
    def make_cache(self, free_slots: Any) -> BasePrefixCache:
        return RadixCache(free_slots, eviction_policy="lfu", page_size=2)


class NoSharingMachine(CacheMachine):
    def make_cache(self, free_slots: Any) -> BasePrefixCache:
        return NoSharingCache(free_slots)


TestRadixLru = CacheMachine.TestCase
TestRadixLfuPaged = LfuPagedCacheMachine.TestCase
TestNoSharing = NoSharingMachine.TestCase
for _case in (TestRadixLru, TestRadixLfuPaged, TestNoSharing):
    _case.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
del _case


# ---------------------------------------------------------------------- continuation queries


def cached_paths(cache: RadixCache) -> list[list[int]]:
    """Every root-to-leaf token sequence of the tree (the reference for continuations)."""
    paths: list[list[int]] = []
    stack: list[tuple[TreeNode, list[int]]] = [(cache._root, [])]
    while stack:
        node, prefix = stack.pop()
        here = prefix + node.key
        if not node.children:
            paths.append(here)
        stack.extend((child, here) for child in node.children.values())
    return paths


def test_continuation_returns_what_follows_on_a_tiny_tree() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    assert cache.continuation([1, 2], 10) == [3, 4, 5]
    assert cache.continuation([1, 2], 2) == [3, 4]
    assert cache.continuation([], 2) == [1, 2]
    assert cache.continuation([1, 2, 3, 4, 5], 4) == []  # nothing cached goes further
    assert cache.continuation([1, 2, 9], 4) == []  # left the tree inside the edge
    assert cache.continuation([7], 4) == []  # no such first token
    assert cache.continuation([1, 2], 0) == []
    assert cache.continuation((1, 2, 3), 1) == [4]  # any sequence type


def test_continuation_follows_the_most_recently_used_branch() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([1, 2, 7, 8, 9], [20, 21, 22, 23, 24])  # [1, 2] -> {[3, 4], [7, 8, 9]}
    assert cache.continuation([1], 10) == [2, 7, 8, 9]  # the later insert
    cache.match_prefix([1, 2, 3, 4])  # now the [3, 4] branch is the most recent
    assert cache.continuation([1], 10) == [2, 3, 4]
    assert cache.continuation([1, 2, 7], 10) == [8, 9]  # an exact path wins over recency


def test_continuation_is_read_only() -> None:
    cache, freed = make_radix()
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([5, 6], [20, 21])
    before = [(n.key, n.last_access, n.hit_count) for n in cache._nodes()]
    assert cache.continuation([1, 2], 5) == [3, 4]  # ends inside an edge: no split
    assert cache.continuation([1, 2, 3, 4], 5) == []
    assert [(n.key, n.last_access, n.hit_count) for n in cache._nodes()] == before
    assert cache.evict(1) == 4 and freed == [10, 11, 12, 13]  # LRU order untouched
    cache.check_integrity()


def test_continuation_with_pages_matches_partial_last_pages() -> None:
    cache, _ = make_radix(page_size=2)
    cache.insert([1, 2, 3, 4, 5, 6], list(range(6)))
    cache.insert([1, 2, 3, 9], list(range(10, 14)))  # split on the page boundary at 2
    assert cache.continuation([1, 2, 3], 4) == [9]  # partial page: most recent that fits
    cache.match_prefix([1, 2, 3, 4])
    assert cache.continuation([1, 2, 3], 4) == [4, 5, 6]
    assert cache.continuation([1, 2, 3, 4], 4) == [5, 6]
    assert cache.continuation([1], 1) == [2]
    assert cache.continuation([1, 2, 8], 4) == []
    cache.check_integrity()


def test_no_sharing_cache_continues_nothing() -> None:
    cache = NoSharingCache(lambda s: None)
    cache.insert([1, 2, 3], [10, 11, 12])
    assert cache.continuation([1], 5) == [] and cache.continuation([], 5) == []
    assert cache.continuation([1], 5, ContinuationCursor()) == []


def test_cursor_survives_splits_and_falls_back_after_eviction_and_reset() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2, 3, 4, 5, 6], list(range(6)))
    cursor = ContinuationCursor()
    assert cache.continuation([1, 2, 3], 2, cursor) == [4, 5]  # stops inside the edge
    cache.insert([1, 2, 3, 4, 7], list(range(10, 15)))  # splits that edge below the cursor
    assert cache.continuation([1, 2, 3, 4], 5, cursor) == [7]
    assert cache.continuation([1, 2, 3, 4, 5], 5, cursor) == [6]
    assert cache.continuation([1, 2, 3, 4, 5, 6], 5, cursor) == []
    cache.evict(cache.total_size)  # every node the cursor knew is gone
    cache.insert([1, 2, 3, 4, 5, 6, 8], list(range(20, 27)))
    assert cache.continuation([1, 2, 3, 4, 5, 6], 5, cursor) == [8]
    cache.reset()
    cache.insert([1, 2, 3, 4, 5, 6, 9, 9], list(range(30, 38)))
    assert cache.continuation([1, 2, 3, 4, 5, 6], 5, cursor) == [9, 9]
    other, _ = make_radix()
    other.insert([1, 2, 3, 4, 5, 6, 4], list(range(7)))
    assert other.continuation([1, 2, 3, 4, 5, 6], 5, cursor) == [4]  # another cache


def test_cursor_sees_a_branch_added_where_the_sequence_left_the_tree() -> None:
    cache, _ = make_radix()
    cache.insert([1, 2, 3, 4, 5, 6], list(range(6)))
    cursor = ContinuationCursor()
    assert cache.continuation([1, 2, 3, 9], 3, cursor) == []  # diverges inside the edge
    assert cache.continuation([1, 2, 3, 9, 9], 3, cursor) == []  # known stuck
    cache.insert([1, 2, 8, 8], list(range(10, 14)))  # a split above the divergence
    assert cache.continuation([1, 2, 3, 9, 9], 3, cursor) == []
    cache.insert([1, 2, 3, 9, 9, 7, 7], list(range(20, 27)))  # the branch that continues
    assert cache.continuation([1, 2, 3, 9, 9], 3, cursor) == [7, 7]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("page_size", [1, 2])
def test_continuation_agrees_with_the_cached_paths_with_and_without_a_cursor(
    seed: int, page_size: int
) -> None:
    """Random inserts, matches and evictions while a growing sequence queries with a cursor:
    the cursor never changes an answer, and every answer is what one cached path says."""
    rng = random.Random(seed)
    cache, _ = make_radix(page_size=page_size)
    next_slot = 0
    seq: list[int] = []
    cursor = ContinuationCursor()
    for _ in range(300):
        op = rng.random()
        if op < 0.3:  # another request's sequence: shares a random prefix of ``seq``
            cut = rng.randrange(len(seq) + 1)
            tokens = seq[:cut] + [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
            tokens = tokens[: len(tokens) - len(tokens) % page_size]
            cache.insert(tokens, list(range(next_slot, next_slot + len(tokens))))
            next_slot += len(tokens)
        elif op < 0.4:
            cache.match_prefix(seq[: rng.randrange(len(seq) + 1)])
        elif op < 0.5:
            cache.evict(rng.randrange(1, 8))
        elif op < 0.52:
            seq, _ = [], cursor.reset()
        else:  # the sequence grows: often by what the tree says, sometimes not
            ahead = cache.continuation(seq, 3)
            seq += ahead[: rng.randrange(1, 4)] if ahead and rng.random() < 0.7 else [
                rng.randrange(4)]
        max_len = rng.randrange(1, 6)
        plain = cache.continuation(seq, max_len)
        assert cache.continuation(seq, max_len, cursor) == plain
        n = len(seq)
        longer = [p for p in cached_paths(cache) if len(p) > n and p[:n] == seq]
        if not longer:
            assert plain == []
        else:
            assert any(plain == p[n : n + max_len] for p in longer), (seq, plain)
    cache.check_integrity()
