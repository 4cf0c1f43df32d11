"""Neox-style (rotate-half) rotary embedding applied in place in Triton.

Twin: ``ref.apply_rotary``. One program rotates one head of one token; ``q``/``k`` may be
strided views (e.g. slices of a fused QKV projection) as long as the last dim is dense.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, cos_stride, sin_stride,
    num_q_heads, half_dim,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < half_dim
    if head < num_q_heads:
        base = q_ptr + t * q_stride_t + head * q_stride_h
    else:
        base = k_ptr + t * k_stride_t + (head - num_q_heads) * k_stride_h
    c = tl.load(cos_ptr + t * cos_stride + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * sin_stride + offs, mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(base + offs, mask=mask, other=0.0)
    x2 = tl.load(base + half_dim + offs, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    tl.store(base + offs, (x1 * c - x2 * s).to(dtype), mask=mask)
    tl.store(base + half_dim + offs, (x2 * c + x1 * s).to(dtype), mask=mask)


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
    half = head_dim // 2
    grid = (num_tokens, num_q_heads + k.shape[1])
    _rotary_kernel[grid](
        q, k, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        num_q_heads, half,
        BLOCK=triton.next_power_of_2(half), num_warps=1,
    )
    return q, k
