"""Elementwise Triton kernels and the dispatch point, each against its torch twin.

Without CUDA the kernels run in Triton's CPU interpreter (small shapes); with CUDA the same
tests run compiled on the GPU and the CPU variants are skipped (the interpreter is off).
Tolerances: fp32 atol = rtol = 1e-5; bf16 atol = rtol = 1e-2 (the twins round each torch op
to bf16 where the kernels round once, so 1-2 bf16 ulps apart).
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DEVICES, DTYPES, enable_interpreter_without_cuda

enable_interpreter_without_cuda()

from radixlm.kernels import (  # noqa: E402  (after the interpreter is enabled)
    activation,
    bitmask,
    dispatch,
    kv_store,
    norm,
    ref,
    rotary,
)

TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2}}


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [100, 576])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm(device: str, dtype: torch.dtype, hidden: int, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(2, 3, hidden, generator=gen).to(device, dtype)
    weight = torch.randn(hidden, generator=gen).to(device, dtype)
    if not with_residual:
        _close(norm.rmsnorm(x, weight, 1e-6), ref.rmsnorm(x, weight, 1e-6), dtype)
        return
    residual = torch.randn(2, 3, hidden, generator=gen).to(device, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    out, h = norm.rmsnorm(x, weight, 1e-6, residual)
    ref_out, ref_h = ref.rmsnorm(x_before, weight, 1e-6, residual_before)
    _close(out, ref_out, dtype)
    assert torch.equal(h, ref_h), "the residual sum must be rounded exactly like torch's"
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [50, 1100])  # one block, and several blocks with a tail
def test_silu_and_mul(device: str, dtype: torch.dtype, width: int) -> None:
    x = (3 * torch.randn(5, 2 * width, generator=torch.Generator().manual_seed(1))).to(
        device, dtype)
    _close(activation.silu_and_mul(x), ref.silu_and_mul(x), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_apply_rotary_in_place_on_fused_qkv_views(
    device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int
) -> None:
    tokens = 7
    gen = torch.Generator().manual_seed(head_dim + heads)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(device, dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    v_before = v.clone()
    positions = torch.tensor([0, 1, 2, 90, 91, 5000, 3], device=device)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    cos, sin = ref.rotary_cos_sin(positions, inv_freq, dtype)
    ref_q, ref_k = ref.apply_rotary(q.clone(), k.clone(), cos, sin)
    out_q, out_k = rotary.apply_rotary(q, k, cos, sin)
    _close(out_q, ref_q, dtype)
    _close(out_k, ref_k, dtype)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    _close(q, ref_q, dtype)  # rotated in place, through the views
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
def test_store_kv_scatters_strided_rows(device: str, dtype: torch.dtype, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    capacity, kv_heads, tokens = 40, 3, 9
    k_cache = torch.randn(capacity, kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(capacity, kv_heads, head_dim, generator=gen).to(device, dtype)
    kv = torch.randn(tokens, 2, kv_heads, head_dim, generator=gen).to(device, dtype)
    k, v = kv[:, 0], kv[:, 1]  # strided views, as split from a fused projection
    loc = torch.randperm(capacity, generator=gen)[:tokens].to(device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ref.store_kv(ref_k, ref_v, loc, k, v)
    kv_store.store_kv(k_cache, v_cache, loc, k, v)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,words", [(100, 4), (100, 3), (2050, 65)])
def test_apply_token_bitmask(device: str, dtype: torch.dtype, vocab: int, words: int) -> None:
    # (100, 4): mask exactly covers the vocabulary's words; (100, 3): logits wider than the
    # mask (tail disallowed); (2050, 65): several blocks, mask wider than the vocabulary.
    gen = torch.Generator().manual_seed(vocab + words)
    logits = torch.randn(3, vocab, generator=gen).to(device, dtype)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=gen, dtype=torch.int32)
    mask[1] = -1  # everything allowed
    mask[2] = 0  # nothing allowed
    mask = mask.to(device)
    expected = ref.apply_token_bitmask(logits.clone(), mask)
    out = bitmask.apply_token_bitmask(logits, mask)
    assert out.data_ptr() == logits.data_ptr()
    assert torch.equal(logits, expected)


def test_dispatch_picks_by_device_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dispatch.KERNELS_ENV, raising=False)
    assert dispatch.get_ops("cpu") is dispatch.REF_OPS
    assert dispatch.get_ops(torch.device("cuda", 0)).name == "triton"
    monkeypatch.setenv(dispatch.KERNELS_ENV, "ref")
    assert dispatch.get_ops("cuda").name == "ref"
    monkeypatch.setenv(dispatch.KERNELS_ENV, "triton")
    ops = dispatch.get_ops("cpu")
    assert ops.name == "triton" and ops.rmsnorm is norm.rmsnorm
    monkeypatch.setenv(dispatch.KERNELS_ENV, "cuda")
    with pytest.raises(ValueError, match="RADIXLM_KERNELS"):
        dispatch.get_ops("cpu")


def test_dispatch_ops_cover_every_twin() -> None:
    twins = {"rmsnorm", "silu_and_mul", "rotary_cos_sin", "apply_rotary", "store_kv",
             "apply_token_bitmask", "decode_attention", "extend_attention"}
    for ops in (dispatch.REF_OPS, dispatch.triton_ops()):
        assert all(callable(getattr(ops, name)) for name in twins)


@pytest.mark.parametrize("device", DEVICES)
def test_triton_ops_run_a_tiny_layer_like_the_twins(device: str) -> None:
    """The ops a model layer chains, through both namespaces, agree end to end."""
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(4, 64, generator=gen).to(device)
    residual = torch.randn(4, 64, generator=gen).to(device)
    w = torch.randn(64, generator=gen).to(device)
    outs = []
    for ops in (dispatch.REF_OPS, dispatch.triton_ops()):
        x, res = ops.rmsnorm(h, w, 1e-5, residual)
        outs.append((ops.silu_and_mul(x), res))
    _close(outs[1][0], outs[0][0], torch.float32)
    _close(outs[1][1], outs[0][1], torch.float32)
