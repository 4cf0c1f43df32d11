"""Neox-style (rotate-half) rotary embedding applied in place in Triton.

Twin: ``ref.apply_rotary``. One program rotates every head of one token (cos/sin are read
once per token); ``q``/``k`` may be strided views (e.g. slices of a fused QKV projection) as
long as the last dim is dense.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(base, stride_h, num_heads, half_dim, c, s,
                  BLOCK_HEADS: tl.constexpr, BLOCK: tl.constexpr):
    """Rotate ``num_heads`` rows of ``2 * half_dim`` at ``base + h * stride_h`` in place."""
    h = tl.arange(0, BLOCK_HEADS)
    offs = tl.arange(0, BLOCK)
    mask = (h < num_heads)[:, None] & (offs < half_dim)[None, :]
    ptrs = base + h[:, None] * stride_h + offs[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0)
    x2 = tl.load(ptrs + half_dim, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    tl.store(ptrs, (x1 * c[None, :] - x2 * s[None, :]).to(dtype), mask=mask)
    tl.store(ptrs + half_dim, (x2 * c[None, :] + x1 * s[None, :]).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, cos_stride, sin_stride,
    num_q_heads, num_k_heads, half_dim,
    BLOCK_Q_HEADS: tl.constexpr, BLOCK_K_HEADS: tl.constexpr, BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < half_dim
    c = tl.load(cos_ptr + t * cos_stride + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * sin_stride + offs, mask=mask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + t * q_stride_t, q_stride_h, num_q_heads, half_dim, c, s,
                  BLOCK_Q_HEADS, BLOCK)
    _rotate_heads(k_ptr + t * k_stride_t, k_stride_h, num_k_heads, half_dim, c, s,
                  BLOCK_K_HEADS, BLOCK)


def launch_params(num_q_heads: int, num_kv_heads: int, head_dim: int) -> dict:
    """Block sizes and warps of a launch (also what the ahead-of-time build compiles)."""
    block_q, block = triton.next_power_of_2(num_q_heads), triton.next_power_of_2(head_dim // 2)
    return {"BLOCK_Q_HEADS": block_q, "BLOCK_K_HEADS": triton.next_power_of_2(num_kv_heads),
            "BLOCK": block, "num_warps": 4 if block_q * block >= 2048 else 2}


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q [T, H, D]`` and ``k [T, Hkv, D]`` in place by ``cos, sin [T, D/2]``
    (fp32 math) and return them. A ``q``/``k`` whose last dim is not dense is copied first,
    so always use the returned tensors."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return q, k
    _rotary_kernel[(num_tokens,)](
        q, k, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        num_q_heads, k.shape[1], head_dim // 2,
        **launch_params(num_q_heads, k.shape[1], head_dim),
    )
    return q, k
