"""The native library on an int8 K/V pool, for every SIMD path this host runs (AVX-512,
AVX2, plain C: ``lib`` of test_native.py).

* The layer's K/V store writes the bytes of the torch twin ``radixlm.kernels.ref.quantize_kv``
  (int8 rows, one bf16 scale per token and KV head), exactly.
* Attention reading int8 K/V in registers equals the torch reference of the int8 math
  (``native_ref.attention`` over the dequantized cache) within 1e-4: the same tolerance as
  the fp32 and bf16 pools, the same numbers up to the order of the sums.
* Against fp32 attention over the unquantized K/V (unit-normal q and V, K rows scaled by
  0.1 .. 3.1, contexts up to 120 positions) the mean |error| stays <= 0.008 and the largest
  <= 0.08 (measured over seeds: means 0.003-0.005, largest 0.01-0.06): the cost of int8 K/V.
"""

from __future__ import annotations

import native_ref
import pytest
import torch
from test_native import lib, needs_compiler  # noqa: F401  (the fixture over the variants)

from radixlm.kernels import ref
from radixlm.native import ops

pytestmark = needs_compiler
SHAPES = [(4, 2, 16), (3, 3, 64), (9, 3, 64), (9, 1, 64), (6, 2, 128), (2, 1, 24)]


def _pool(gen: torch.Generator, slots: int, kv_heads: int, dim: int):
    """Random fp32 K/V whose rows differ in magnitude (as a model's heads do), and the same
    quantized by the twin: (k, v, k_q, v_q, k_s, v_s)."""
    gain = torch.rand(slots, kv_heads, 1, generator=gen) * 3 + 0.1
    k = torch.randn(slots, kv_heads, dim, generator=gen) * gain
    v = torch.randn(slots, kv_heads, dim, generator=gen)
    (k_q, k_s), (v_q, v_s) = ref.quantize_kv(k), ref.quantize_kv(v)
    return k, v, k_q, v_q, k_s, v_s


@pytest.mark.parametrize("kv_heads,dim", [(3, 64), (2, 128), (1, 24), (4, 16)])
def test_store_writes_the_twins_bytes(lib, kv_heads, dim):  # noqa: F811
    gen = torch.Generator().manual_seed(dim)
    x = torch.randn(7, kv_heads, dim, generator=gen) * torch.tensor([1e-3, 1.0, 40.0, 5.0,
                                                                     0.3, 2.0, 7.0])[:, None, None]
    x[3, 0] = 0  # an all-zero row: scale 0
    x[5, -1, 3] = 1e5  # an outlier
    slots = torch.tensor([9, 2, 5, 11, 1, 7, 3])
    cache = torch.zeros(12, kv_heads, dim, dtype=torch.int8)
    scales = torch.zeros(12, kv_heads, dtype=torch.bfloat16)
    ops.store_kv(lib, x, slots, cache, scales)
    q, s = ref.quantize_kv(x)
    assert torch.equal(cache[slots], q) and torch.equal(scales[slots], s)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert not cache[untouched].any() and not scales[untouched].any()


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_attention_reads_int8_as_the_reference_of_the_int8_math(lib, heads, kv_heads,  # noqa: F811
                                                                dim):
    gen = torch.Generator().manual_seed(heads * dim)
    slots = 400
    _, _, k_q, v_q, k_s, v_s = _pool(gen, slots, kv_heads, dim)
    table = torch.randperm(slots - 1, generator=gen)[:3 * 120].view(3, 120).int() + 1
    rows = torch.tensor([2, 0, 0, 1, 2])  # request 0 has two tokens in the step
    pos = torch.tensor([0, 40, 41, 119, 7])
    q = torch.randn(5, heads, dim, generator=gen)
    out = ops.attention(lib, q, rows, pos, table, k_q, v_q, dim ** -0.5, k_s, v_s)
    expected = native_ref.attention(q, rows, pos, table, ref.dequantize_kv(k_q, k_s),
                                    ref.dequantize_kv(v_q, v_s), dim ** -0.5)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_int8_attention_stays_near_fp32_attention(lib, heads, kv_heads, dim):  # noqa: F811
    gen = torch.Generator().manual_seed(7 + heads * dim)
    k, v, k_q, v_q, k_s, v_s = _pool(gen, 400, kv_heads, dim)
    table = torch.randperm(399, generator=gen)[:2 * 120].view(2, 120).int() + 1
    rows = torch.tensor([0, 1, 1, 0])
    pos = torch.tensor([3, 60, 119, 119])
    q = torch.randn(4, heads, dim, generator=gen)
    out = ops.attention(lib, q, rows, pos, table, k_q, v_q, dim ** -0.5, k_s, v_s)
    exact = native_ref.attention(q, rows, pos, table, k, v, dim ** -0.5)
    err = (out - exact).abs()
    assert err.mean() <= 0.008 and err.max() <= 0.08, (err.mean(), err.max())
    assert err.max() > 0  # it did read the quantized values
