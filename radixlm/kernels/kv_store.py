"""Scatter new K/V rows into KV-pool slots in Triton. Twins: ``ref.store_kv`` and, for an
int8 pool, ``ref.store_kv_int8`` (the same bytes: see ``ref.quantize_kv``)."""

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


@triton.jit
def _quantize_rows(x, cache_ptr, dst, scale_ptr, scale_dst, mask, h_mask):
    """Store ``x [BLOCK_H, BLOCK_D]`` (fp32) as int8 rows with one bf16 scale each:
    ``ref.quantize_kv``'s rule (round half to even written with ``floor``, which the
    interpreter has too; a compiled kernel may fuse ``x * inv + 0.5`` into one FMA, which
    can move a value that lies within an ulp of a half step by one level)."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.math.div_rn(amax, 127.0).to(tl.bfloat16)
    s = scale.to(tl.float32)
    inv = tl.where(s > 0, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s), 0.0)
    y = x * inv[:, None]
    r = tl.floor(y + 0.5)
    odd = r * 0.5 != tl.floor(r * 0.5)
    r = tl.where((r - y == 0.5) & odd, r - 1.0, r)  # ties to even
    r = tl.minimum(tl.maximum(r, -127.0), 127.0)
    tl.store(cache_ptr + dst, r.to(tl.int8), mask=mask)
    tl.store(scale_ptr + scale_dst, scale, mask=h_mask)


@triton.jit
def _store_kv_int8_kernel(
    k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, loc_ptr, k_ptr, v_ptr,
    cache_stride_s, cache_stride_h, scale_stride_s, k_stride_t, k_stride_h, v_stride_t,
    v_stride_h, num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # one program quantizes every KV head of one token
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_mask = h < num_kv_heads
    mask = h_mask[:, None] & (d < head_dim)[None, :]
    slot = tl.load(loc_ptr + t).to(tl.int64)
    dst = slot * cache_stride_s + h[:, None] * cache_stride_h + d[None, :]
    scale_dst = slot * scale_stride_s + h
    k = tl.load(k_ptr + t * k_stride_t + h[:, None] * k_stride_h + d[None, :], mask=mask,
                other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t * v_stride_t + h[:, None] * v_stride_h + d[None, :], mask=mask,
                other=0.0).to(tl.float32)
    _quantize_rows(k, k_cache_ptr, dst, k_scale_ptr, scale_dst, mask, h_mask)
    _quantize_rows(v, v_cache_ptr, dst, v_scale_ptr, scale_dst, mask, h_mask)


def launch_params(num_kv_heads: int, head_dim: int) -> dict:
    """Block sizes and warps of a launch (also what the ahead-of-time build compiles)."""
    block_h, block_d = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    return {"BLOCK_H": block_h, "BLOCK_D": block_d,
            "num_warps": 4 if block_h * block_d >= 2048 else 2}


def _dense_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write ``k, v [T, Hkv, D]`` into rows ``loc [T]`` of ``k_cache, v_cache [S, Hkv, D]``
    (which must share one layout). ``k``/``v`` may be strided views with a dense last dim."""
    k, v = _dense_last(k), _dense_last(v)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k_cache, v_cache, loc, k, v,
        k_cache.stride(0), k_cache.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        num_kv_heads, head_dim, **launch_params(num_kv_heads, head_dim),
    )


def store_kv_int8(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                  v_scale: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor) -> None:
    """Quantize ``k, v [T, Hkv, D]`` into rows ``loc [T]`` of the int8 caches ``[S, Hkv, D]``
    and their bf16 scales ``[S, Hkv]`` (caches and scales each sharing one layout)."""
    k, v = _dense_last(k), _dense_last(v)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert k_scale.stride() == v_scale.stride() and k_scale.stride(-1) == 1
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_int8_kernel[(num_tokens,)](
        k_cache, v_cache, k_scale, v_scale, loc, k, v,
        k_cache.stride(0), k_cache.stride(1), k_scale.stride(0), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), num_kv_heads, head_dim,
        **launch_params(num_kv_heads, head_dim),
    )
