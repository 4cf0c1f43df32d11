"""Scatter new K/V rows into KV-pool slots in Triton. Twin: ``ref.store_kv``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_cache_ptr, v_cache_ptr, loc_ptr, k_ptr, v_ptr,
    cache_stride_s, cache_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
    num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # one program writes every KV head of one token
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h < num_kv_heads)[:, None] & (d < head_dim)[None, :]
    slot = tl.load(loc_ptr + t).to(tl.int64)
    dst = slot * cache_stride_s + h[:, None] * cache_stride_h + d[None, :]
    k = tl.load(k_ptr + t * k_stride_t + h[:, None] * k_stride_h + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * v_stride_t + h[:, None] * v_stride_h + d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def launch_params(num_kv_heads: int, head_dim: int) -> dict:
    """Block sizes and warps of a launch (also what the ahead-of-time build compiles)."""
    block_h, block_d = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    return {"BLOCK_H": block_h, "BLOCK_D": block_d,
            "num_warps": 4 if block_h * block_d >= 2048 else 2}


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write ``k, v [T, Hkv, D]`` into rows ``loc [T]`` of ``k_cache, v_cache [S, Hkv, D]``
    (which must share one layout). ``k``/``v`` may be strided views with a dense last dim."""
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k_cache, v_cache, loc, k, v,
        k_cache.stride(0), k_cache.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        num_kv_heads, head_dim, **launch_params(num_kv_heads, head_dim),
    )
