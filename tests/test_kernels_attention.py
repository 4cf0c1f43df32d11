"""Attention kernels and the Triton backend against the torch twins, on a fake KV pool.

The pool layout exercises what the radix cache produces: requests in arbitrary rows of
``req_to_token``, scattered slots, and a prefix whose slots appear in several rows.
Without CUDA the kernels run in Triton's CPU interpreter; with CUDA the same tests run
compiled and the CPU variants are skipped. Tolerances: fp32 atol = rtol = 2e-5;
bf16 atol = rtol = 2e-2 (the kernels round softmax weights to bf16 before P @ V).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kernel_testing import DEVICES, DTYPES, enable_interpreter_without_cuda

enable_interpreter_without_cuda()

from radixlm.kernels import attention_decode, attention_extend, ref  # noqa: E402
from radixlm.runtime.attention.base import create_attention_backend  # noqa: E402
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode  # noqa: E402

TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
HEADS = [(4, 4), (6, 2)]  # (H, Hkv): GQA ratios 1 and 3
CAPACITY, MAX_RUNNING, MAX_CONTEXT = 1400, 6, 208
ROWS = [3, 0, 5, 1]  # req_to_token row of each request
SHARED = 70  # requests 1 and 3 share their first SHARED slots


def make_pool(device: str, dtype: torch.dtype, kv_heads: int, head_dim: int,
              num_layers: int = 1, seed: int = 0) -> SimpleNamespace:
    """Random K/V everywhere; each row of ``req_to_token`` lists its own scattered slots, no
    slot in two rows (so a step never writes one slot twice) except that rows ``ROWS[1]``
    and ``ROWS[3]`` start with the same ``SHARED`` slots."""
    gen = torch.Generator().manual_seed(seed)
    shape = (CAPACITY, kv_heads, head_dim)
    perm = torch.randperm(CAPACITY, generator=gen).int()
    shared, own = perm[:SHARED], perm[SHARED : SHARED + MAX_RUNNING * MAX_CONTEXT]
    req_to_token = own.view(MAX_RUNNING, MAX_CONTEXT).clone()
    for row in (ROWS[1], ROWS[3]):
        req_to_token[row, :SHARED] = shared
    return SimpleNamespace(
        k_buffer=[torch.randn(shape, generator=gen).to(device, dtype) for _ in range(num_layers)],
        v_buffer=[torch.randn(shape, generator=gen).to(device, dtype) for _ in range(num_layers)],
        req_to_token=req_to_token.to(device),
        scales=lambda layer: (None, None),  # KVPool.scales of an unquantized pool
    )


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_kv_splits", [None, 7])
def test_decode_attention(device: str, dtype: torch.dtype, heads: int, kv_heads: int,
                          head_dim: int, num_kv_splits: int | None) -> None:
    # Lengths: a lone token, shared prefix + a few (two requests), not multiples of 64.
    # 7 splits of a 1-token context leave empty pieces that stage 2 must skip.
    pool = make_pool(device, dtype, kv_heads, head_dim, seed=head_dim + heads)
    seq_lens = torch.tensor([1, SHARED + 7, 200, SHARED + 1], device=device)
    rows = torch.tensor(ROWS, device=device)
    q = torch.randn(4, heads, head_dim, generator=torch.Generator().manual_seed(1)).to(
        device, dtype)
    args = (q, pool.k_buffer[0], pool.v_buffer[0], pool.req_to_token, rows, seq_lens,
            head_dim**-0.5)
    out = attention_decode.decode_attention(*args, num_kv_splits=num_kv_splits)
    _close(out, ref.decode_attention(*args), dtype)


def test_choose_num_kv_splits() -> None:
    assert attention_decode.choose_num_kv_splits(64, 8, 100) == 1  # short: never split
    assert attention_decode.choose_num_kv_splits(1, 8, 100_000) == 32  # capped
    assert attention_decode.choose_num_kv_splits(4, 2, 1000) == 4  # >= 256 rows per piece
    assert attention_decode.choose_num_kv_splits(128, 8, 32_000) == 1  # grid already full


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_extend_attention(device: str, dtype: torch.dtype, heads: int, kv_heads: int,
                          head_dim: int) -> None:
    # Empty prefix, one new token after a shared prefix, 20 new after 5 cached, and 65 new
    # (two query blocks) after the same shared prefix.
    pool = make_pool(device, dtype, kv_heads, head_dim, seed=head_dim * heads)
    prefix_lens = torch.tensor([0, SHARED, 5, SHARED], device=device)
    extend_lens = torch.tensor([3, 1, 20, 65], device=device)
    rows = torch.tensor(ROWS, device=device)
    q = torch.randn(int(extend_lens.sum()), heads, head_dim,
                    generator=torch.Generator().manual_seed(2)).to(device, dtype)
    args = (q, pool.k_buffer[0], pool.v_buffer[0], pool.req_to_token, rows, prefix_lens,
            extend_lens, head_dim**-0.5)
    _close(attention_extend.extend_attention(*args), ref.extend_attention(*args), dtype)


def _batch(mode: ForwardMode, prefix_lens: list[int], extend_lens: list[int],
           pool: SimpleNamespace, device: str) -> ForwardBatch:
    rows = ROWS[: len(prefix_lens)]
    locs, positions = [], []
    for row, p, n in zip(rows, prefix_lens, extend_lens, strict=True):
        locs += pool.req_to_token[row, p : p + n].tolist()
        positions += list(range(p, p + n))
    starts = [sum(extend_lens[:i]) for i in range(len(extend_lens))]
    seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens, strict=True)]

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return ForwardBatch(
        mode=mode, input_ids=t([0] * len(locs)), positions=t(positions), out_cache_loc=t(locs),
        req_pool_indices=t(rows), seq_lens=t(seq_lens), prefix_lens=t(prefix_lens),
        extend_lens=t(extend_lens), extend_start_loc=t(starts),
        logits_indices=t([s + n - 1 for s, n in zip(starts, extend_lens, strict=True)]),
        seq_lens_cpu=seq_lens, prefix_lens_cpu=prefix_lens, extend_lens_cpu=extend_lens,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_backend_matches_twins_over_extend_then_decode(device: str,
                                                              dtype: torch.dtype) -> None:
    heads, kv_heads, head_dim, layers = 6, 2, 64, 2
    pool = make_pool(device, dtype, kv_heads, head_dim, num_layers=layers)
    twin_pool = SimpleNamespace(k_buffer=[k.clone() for k in pool.k_buffer],
                                v_buffer=[v.clone() for v in pool.v_buffer],
                                req_to_token=pool.req_to_token)
    backend = create_attention_backend("triton", pool, heads, kv_heads, head_dim)
    scale = head_dim**-0.5
    gen = torch.Generator().manual_seed(3)
    steps = [(ForwardMode.EXTEND, [0, SHARED, 5, SHARED], [3, 9, 70, 4]),
             (ForwardMode.DECODE, [3, SHARED + 9, 75, SHARED + 4], [1, 1, 1, 1])]
    for mode, prefix_lens, extend_lens in steps:
        batch = _batch(mode, prefix_lens, extend_lens, pool, device)
        backend.init_forward_metadata(batch)
        for layer in range(layers):
            q = torch.randn(batch.num_tokens, heads, head_dim, generator=gen).to(device, dtype)
            k = torch.randn(batch.num_tokens, kv_heads, head_dim, generator=gen).to(device, dtype)
            v = torch.randn(batch.num_tokens, kv_heads, head_dim, generator=gen).to(device, dtype)
            out = backend.forward(q, k, v, layer, batch)
            k_twin, v_twin = twin_pool.k_buffer[layer], twin_pool.v_buffer[layer]
            ref.store_kv(k_twin, v_twin, batch.out_cache_loc, k, v)
            if mode == ForwardMode.DECODE:
                expected = ref.decode_attention(q, k_twin, v_twin, pool.req_to_token,
                                                batch.req_pool_indices, batch.seq_lens, scale)
            else:
                expected = ref.extend_attention(q, k_twin, v_twin, pool.req_to_token,
                                                batch.req_pool_indices, batch.prefix_lens,
                                                batch.extend_lens, scale)
            assert torch.equal(pool.k_buffer[layer], k_twin)
            assert torch.equal(pool.v_buffer[layer], v_twin)
            _close(out, expected, dtype)
