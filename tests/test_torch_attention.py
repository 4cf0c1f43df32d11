"""The CPU torch attention backend (mirror, batched one-token rows) against the twins.

A scripted sequence of steps over a real ``KVPool``: prefill, decode of every row, decode of
scattered subsets (holes between the rows of one SDPA call, rows far apart), an
extend step mixing one-token rows with multi-token rows, and a row handed to a new request.
Each step's output must equal ``ref.decode_attention`` / ``ref.extend_attention`` reading
the pool through ``req_to_token``, with and without the mirror (gather fallback), and on an
int8 pool (the store writes ``ref.quantize_kv``'s bytes; the twins read it dequantized).
"""

from __future__ import annotations

import pytest
import torch
from batch_fakes import extend_batch

from radixlm.kernels import ref
from radixlm.runtime.attention.base import create_attention_backend
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.kv_pool import KVPool, SlotAllocator

HEADS, KV_HEADS, HEAD_DIM, LAYERS, ROWS, CONTEXT = 6, 2, 32, 2, 20, 96
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


class Harness:
    def __init__(self, dtype: torch.dtype, mirror_bytes: int | None,
                 context: int = CONTEXT, kv_cache_dtype: str = "auto") -> None:
        self.dtype = dtype
        self.pool = KVPool(2048, LAYERS, KV_HEADS, HEAD_DIM, dtype, torch.device("cpu"), ROWS,
                           context, kv_cache_dtype=kv_cache_dtype)
        options = {} if mirror_bytes is None else {"mirror_budget_bytes": mirror_bytes}
        self.backend = create_attention_backend("torch", self.pool, HEADS, KV_HEADS, HEAD_DIM,
                                                **options)
        self.slots = SlotAllocator(2048)
        self.lens = {}  # row -> tokens with K/V
        self.owner = {}  # row -> request uid
        self.next_uid = 0
        self.gen = torch.Generator().manual_seed(0)

    def new_request(self, row: int) -> None:
        self.lens[row], self.owner[row] = 0, self.next_uid
        self.next_uid += 1

    def step(self, mode: ForwardMode, work: list[tuple[int, int]]) -> None:
        """``work``: (row, new tokens) in batch order."""
        batch = extend_batch(self.pool, mode, work, self.lens, self.slots.alloc,
                             [self.owner[r] for r, _ in work])
        t = len(batch.input_ids)
        self.backend.init_forward_metadata(batch)
        self.last_meta = batch.attn_metadata
        scale = HEAD_DIM**-0.5
        for layer in range(LAYERS):
            q, k, v = (torch.randn(t, h, HEAD_DIM, generator=self.gen).to(self.dtype)
                       for h in (HEADS, KV_HEADS, KV_HEADS))
            out = self.backend.forward(q, k, v, layer, batch)
            kc, vc = self.pool.k_buffer[layer], self.pool.v_buffer[layer]
            ks, vs = self.pool.scales(layer)
            if ks is None:
                assert torch.equal(kc[batch.out_cache_loc], k)
            else:
                assert torch.equal(kc[batch.out_cache_loc], ref.quantize_kv(k)[0])
                assert torch.equal(vs[batch.out_cache_loc], ref.quantize_kv(v)[1])
            if mode == ForwardMode.DECODE:
                expected = ref.decode_attention(q, kc, vc, self.pool.req_to_token,
                                                batch.req_pool_indices, batch.seq_lens, scale,
                                                ks, vs)
            else:
                expected = ref.extend_attention(q, kc, vc, self.pool.req_to_token,
                                                batch.req_pool_indices, batch.prefix_lens,
                                                batch.extend_lens, scale, ks, vs)
            assert out.shape == q.shape and out.dtype == q.dtype
            torch.testing.assert_close(out.float(), expected.float(), **TOL[self.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mirror_bytes", [None, 0], ids=["mirror", "gather"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_torch_backend_matches_twins_over_scattered_batches(dtype, mirror_bytes,
                                                            kv_cache_dtype) -> None:
    h = Harness(dtype, mirror_bytes, kv_cache_dtype=kv_cache_dtype)
    first = [0, 1, 2, 3, 4, 5, 12, 19]
    for row in first:
        h.new_request(row)
    E, D = ForwardMode.EXTEND, ForwardMode.DECODE
    h.step(E, [(row, 3 + 2 * i) for i, row in enumerate(first)])  # prefill, ragged
    h.step(D, [(row, 1) for row in first])  # every row, in row order
    h.step(D, [(19, 1), (2, 1), (0, 1), (12, 1), (5, 1)])  # unsorted, holes, far apart
    h.step(D, [(4, 1)])  # one row in the middle
    h.step(E, [(3, 1), (12, 6), (0, 1), (19, 1), (1, 4)])  # one-token rows among extends
    h.step(E, [(2, 1), (4, 1), (5, 1)])  # extend step made only of one-token rows
    h.new_request(4)  # row 4 now belongs to another request: its mirror is stale
    h.step(E, [(4, 7), (3, 1)])
    h.step(D, [(4, 1), (3, 1), (1, 1), (19, 1)])
    for _ in range(3):
        h.step(D, [(row, 1) for row in first])


def test_decode_batches_are_moved_into_the_lowest_mirror_slots() -> None:
    """However requests come and go, a decode step reads slots 0 .. B-1 in one SDPA call
    (K/V of requests above that moved down); more requests over time than slots reuse the
    slots of requests no longer in steps. Outputs match the twins all along."""
    h = Harness(torch.float32, None)
    E, D = ForwardMode.EXTEND, ForwardMode.DECODE
    rows = list(range(ROWS))
    for row in rows:
        h.new_request(row)
    h.step(E, [(row, 2 + row % 5) for row in rows])
    h.step(D, [(row, 1) for row in rows])
    survivors = [17, 3, 11]
    h.step(D, [(row, 1) for row in survivors])
    group = h.last_meta.group  # one SDPA call over slots 0..2, no holes
    assert (group.lo, group.hi) == (0, 3) and sorted(group.slots.tolist()) == [0, 1, 2]
    assert h.backend.slots.moves >= 2  # rows 17 and 11 sat above slot 2
    for wave in range(3):  # 3 x 6 new requests: more owners than slots over time
        fresh = [r for r in rows if r not in survivors][wave * 6:(wave + 1) * 6]
        for row in fresh:
            h.new_request(row)
        h.step(E, [(row, 3 + wave) for row in fresh])
        for _ in range(2):
            h.step(D, [(row, 1) for row in survivors + fresh])
            group = h.last_meta.group
            assert (group.lo, group.hi) == (0, len(survivors) + len(fresh))
    assert len(h.backend.slots.slot_of) <= ROWS


def test_mirror_slots_pack_decode_batches_and_reuse_least_recently_used():
    """The bookkeeping alone (no torch): moves down, valid lengths carried, LRU reuse."""
    from radixlm.runtime.attention.mirror_slots import MirrorSlots

    ms = MirrorSlots(4)
    assert ms.place([10, 11, 12, 13], compact=False) == ([0, 1, 2, 3], [])
    for slot, n in enumerate([5, 6, 7, 8]):
        ms.valid[slot] = n
    slots, moves = ms.place([13, 11], compact=True)  # 13 sits in slot 3 >= 2: moves down
    assert slots == [0, 1] and moves == [(3, 0, 8)]  # slot 0 (request 10) was least recent
    assert ms.valid[0] == 8 and ms.owner[3] is None and 10 not in ms.slot_of
    slots, moves = ms.place([20], compact=False)  # free slot 3 first
    assert slots == [3] and moves == [] and ms.valid[3] == 0
    slots, _ = ms.place([21], compact=False)  # none free: LRU among {12 (step 1), ...}
    assert slots == [2] and 12 not in ms.slot_of
    with pytest.raises(RuntimeError):
        ms.place([30, 31, 32, 33, 34], compact=True)


def test_mirror_stays_consistent_across_unmirrored_steps_and_truncation():
    """A mirror budget for 256 positions: a step past it runs unmirrored (gather through
    req_to_token). A request truncated and rewritten while unmirrored must not read its old
    mirrored K/V when it is mirrored again."""
    token_bytes = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4  # fp32
    h = Harness(torch.float32, ROWS * 256 * token_bytes, context=512)
    E, D = ForwardMode.EXTEND, ForwardMode.DECODE
    h.new_request(0)
    h.step(E, [(0, 250)])
    for _ in range(3):
        h.step(D, [(0, 1)])  # mirrored: positions up to 253
    assert h.last_meta.use_mirror
    h.lens[0] = 240  # rolled back (jump-forward retokenization, retraction)
    h.step(E, [(0, 20)])  # 260 > 256: unmirrored, rewrites positions 240..259
    assert not h.last_meta.use_mirror
    h.lens[0] = 245  # rolled back again, now short enough to mirror
    h.step(D, [(0, 1)])
    assert h.last_meta.use_mirror
