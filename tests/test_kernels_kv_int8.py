"""The Triton kernels on an int8 KV pool against their torch twins (``ref``).

The store kernel must write the bytes of ``ref.store_kv_int8`` (int8 rows and bf16 scales);
the decode and extend kernels read int8 K/V with per-(token, KV head) scales and must give
what the twins give on the dequantized cache, over scattered slots and a prefix shared by
two rows. Without CUDA the kernels run in Triton's CPU interpreter; with CUDA compiled.
Tolerances as for the unquantized kernels (the inputs are the same dequantized numbers):
fp32 atol = rtol = 2e-5, bf16 atol = rtol = 2e-2.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICES, DTYPES, enable_interpreter_without_cuda

enable_interpreter_without_cuda()

from radixlm.kernels import attention_decode, attention_extend, kv_store, ref  # noqa: E402
from radixlm.runtime.attention.base import create_attention_backend  # noqa: E402
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from radixlm.runtime.kv_pool import KVPool  # noqa: E402

TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
CAPACITY, ROWS, CONTEXT = 900, 4, 160
SHARED = 50  # rows 1 and 3 start with the same SHARED slots


def _int8_caches(device: str, kv_heads: int, head_dim: int, seed: int):
    """Int8 K/V caches (random K/V quantized by the twin, magnitudes varying by row) and a
    ``req_to_token`` of scattered slots, rows 1 and 3 sharing a prefix."""
    gen = torch.Generator().manual_seed(seed)
    shape = (CAPACITY, kv_heads, head_dim)
    row_gain = torch.rand(CAPACITY, kv_heads, 1, generator=gen) * 4 + 0.05
    k_q, k_s = ref.quantize_kv(torch.randn(shape, generator=gen) * row_gain)
    v_q, v_s = ref.quantize_kv(torch.randn(shape, generator=gen) * row_gain)
    perm = torch.randperm(CAPACITY - 1, generator=gen).int() + 1
    table = perm[SHARED:SHARED + ROWS * CONTEXT].view(ROWS, CONTEXT).clone()
    table[1, :SHARED] = table[3, :SHARED] = perm[:SHARED]
    return [t.to(device) for t in (k_q, v_q, k_s, v_s, table)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
def test_store_kv_int8_writes_the_twins_bytes(device: str, dtype: torch.dtype,
                                              head_dim: int) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    capacity, kv_heads, tokens = 40, 3, 9
    kv = (torch.randn(tokens, 2, kv_heads, head_dim, generator=gen) * 3).to(device, dtype)
    kv[2, 0, 1] = 0  # an all-zero row: scale 0, values 0
    kv[4, 1, 0, 5] = 1e4  # an outlier: the rest of its row rounds to few levels
    k, v = kv[:, 0], kv[:, 1]  # strided views, as split from a fused projection
    loc = torch.randperm(capacity, generator=gen)[:tokens].to(device)
    caches = [torch.zeros(capacity, kv_heads, head_dim, dtype=torch.int8, device=device)
              for _ in range(2)]
    scales = [torch.zeros(capacity, kv_heads, dtype=torch.bfloat16, device=device)
              for _ in range(2)]
    twin = [c.clone() for c in caches + scales]
    kv_store.store_kv_int8(*caches, *scales, loc, k, v)
    ref.store_kv_int8(*twin, loc, k, v)
    for ours, theirs in zip(caches + scales, twin):
        if device == "cpu":
            assert torch.equal(ours, theirs)
        else:  # a compiled kernel may fuse x * inv + 0.5 (see kv_store._quantize_rows)
            assert (ours.float() - theirs.float()).abs().max() <= (1 if ours.dtype ==
                                                                   torch.int8 else 0)
    assert int(caches[0][loc[2], 1].abs().max()) == 0 and float(scales[0][loc[2], 1]) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_kv_splits", [None, 5])
def test_decode_attention_reads_int8(device: str, dtype: torch.dtype, heads: int,
                                     kv_heads: int, head_dim: int,
                                     num_kv_splits: int | None) -> None:
    k_q, v_q, k_s, v_s, table = _int8_caches(device, kv_heads, head_dim, heads + head_dim)
    seq_lens = torch.tensor([1, SHARED + 9, CONTEXT, SHARED + 1], device=device)
    rows = torch.tensor([0, 1, 2, 3], device=device)
    q = torch.randn(4, heads, head_dim, generator=torch.Generator().manual_seed(1)).to(
        device, dtype)
    args = (q, k_q, v_q, table, rows, seq_lens, head_dim**-0.5, k_s, v_s)
    out = attention_decode.decode_attention(*args, num_kv_splits=num_kv_splits)
    expected = ref.decode_attention(*args)
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.float(), expected.float(), **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_extend_attention_reads_int8(device: str, dtype: torch.dtype, heads: int, kv_heads: int,
                                     head_dim: int) -> None:
    k_q, v_q, k_s, v_s, table = _int8_caches(device, kv_heads, head_dim, heads * head_dim)
    prefix_lens = torch.tensor([0, SHARED, 5, SHARED], device=device)
    extend_lens = torch.tensor([3, 1, 20, 70], device=device)
    rows = torch.tensor([0, 1, 2, 3], device=device)
    q = torch.randn(int(extend_lens.sum()), heads, head_dim,
                    generator=torch.Generator().manual_seed(2)).to(device, dtype)
    args = (q, k_q, v_q, table, rows, prefix_lens, extend_lens, head_dim**-0.5, k_s, v_s)
    out = attention_extend.extend_attention(*args)
    torch.testing.assert_close(out.float(), ref.extend_attention(*args).float(), **TOL[dtype])


def _batch(mode: ForwardMode, prefix: list[int], extend: list[int], table: torch.Tensor,
           device: str) -> ForwardBatch:
    locs, positions = [], []
    for row, (p, n) in enumerate(zip(prefix, extend)):
        locs += table[row, p:p + n].tolist()
        positions += list(range(p, p + n))
    starts = [sum(extend[:i]) for i in range(len(extend))]
    seq = [p + n for p, n in zip(prefix, extend)]

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return ForwardBatch(
        mode=mode, input_ids=t([0] * len(locs)), positions=t(positions), out_cache_loc=t(locs),
        req_pool_indices=t(list(range(len(prefix)))), seq_lens=t(seq), prefix_lens=t(prefix),
        extend_lens=t(extend), extend_start_loc=t(starts), logits_indices=t([0]),
        seq_lens_cpu=seq, prefix_lens_cpu=prefix, extend_lens_cpu=extend)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_backend_on_an_int8_pool(device: str, dtype: torch.dtype) -> None:
    """A real int8 ``KVPool`` through the Triton backend: a prefill, an extend step (one
    row reading another's prefix, one-token rows among longer ones), then a decode step;
    the pool holds the twin's bytes after each layer's store and the outputs equal the
    twins reading it."""
    heads, kv_heads, head_dim, layers = 6, 2, 64, 2
    pool = KVPool(CAPACITY, layers, kv_heads, head_dim, dtype, torch.device(device), ROWS,
                  CONTEXT, kv_cache_dtype="int8")
    _, _, _, _, table = _int8_caches(device, kv_heads, head_dim, 7)
    pool.req_to_token.copy_(table)
    twin = [[b.clone() for b in bufs] for bufs in (pool.k_buffer, pool.v_buffer, pool.k_scale,
                                                   pool.v_scale)]
    backend = create_attention_backend("triton", pool, heads, kv_heads, head_dim)
    gen = torch.Generator().manual_seed(3)
    # row 3 joins with row 1's first SHARED tokens as its cached prefix
    steps = [(ForwardMode.EXTEND, [0, 0, 0], [3, SHARED + 9, 70]),
             (ForwardMode.EXTEND, [3, SHARED + 9, 70, SHARED], [1, 1, 30, 4]),
             (ForwardMode.DECODE, [4, SHARED + 10, 100, SHARED + 4], [1, 1, 1, 1])]
    for mode, prefix, extend in steps:
        batch = _batch(mode, prefix, extend, table, device)
        backend.init_forward_metadata(batch)
        for layer in range(layers):
            q, k, v = (torch.randn(batch.num_tokens, h, head_dim, generator=gen).to(device, dtype)
                       for h in (heads, kv_heads, kv_heads))
            out = backend.forward(q, k, v, layer, batch)
            kc, vc, ks, vs = (bufs[layer] for bufs in twin)
            ref.store_kv_int8(kc, vc, ks, vs, batch.out_cache_loc, k, v)
            loc = batch.out_cache_loc  # (the other slots hold whatever torch.empty gave)
            for ours, theirs in zip((pool.k_buffer, pool.v_buffer, pool.k_scale, pool.v_scale),
                                    (kc, vc, ks, vs)):
                diff = (ours[layer][loc].float() - theirs[loc].float()).abs().max()
                assert diff <= (device != "cpu")
            args = (q, kc, vc, table, batch.req_pool_indices)
            if mode == ForwardMode.DECODE:
                expected = ref.decode_attention(*args, batch.seq_lens, head_dim**-0.5, ks, vs)
            else:
                expected = ref.extend_attention(*args, batch.prefix_lens, batch.extend_lens,
                                                head_dim**-0.5, ks, vs)
            torch.testing.assert_close(out.float(), expected.float(), **TOL[dtype])
