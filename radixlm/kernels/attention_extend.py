"""Extend (prefill) attention over a cached prefix in Triton. Twin: ``ref.extend_attention``.

A ragged batch: request ``b`` owns rows ``extend_start_loc[b] .. + extend_lens[b]`` of ``q``.
Its new token ``i`` sits at position ``prefix_lens[b] + i`` and attends to positions
``0 .. prefix_lens[b] + i``, all read in place through ``req_to_token`` (the new K/V are
stored before the call), so a prefix shared by several requests is never copied.

Grid ``(B, H, cdiv(max_extend_len, BLOCK_M))``: one program holds ``BLOCK_M`` query rows of
one head and streams the KV rows up to its last query's position, with an online softmax.
Only the key blocks that reach into the new tokens need the causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.kernels.attention_common import (
    kv_block,
    kv_scores,
    online_softmax_step,
    scale_args,
)
from radixlm.kernels.triton_utils import dot_precision


@triton.jit
def _extend_kernel(
    q_ptr, out_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, req_to_token_ptr,
    req_pool_indices_ptr, prefix_lens_ptr, extend_lens_ptr, extend_start_loc_ptr,
    q_stride_t, q_stride_h, out_stride_t, out_stride_h, cache_stride_s, cache_stride_h,
    scale_stride_s, r2t_stride,
    scale, group, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr, KV_INT8: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    extend_len = tl.load(extend_lens_ptr + b).to(tl.int32)
    if m_block * BLOCK_M >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + b).to(tl.int32)
    first_row = tl.load(extend_start_loc_ptr + b).to(tl.int64)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    kv_head = head // group

    i = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # index among the new tokens
    i_mask = i < extend_len
    q_pos = prefix_len + i
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    q_off = (first_row + i)[:, None] * q_stride_t + head * q_stride_h + d[None, :]
    q = tl.load(q_ptr + q_off, mask=i_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    kv_end = tl.minimum(prefix_len + (m_block + 1) * BLOCK_M, prefix_len + extend_len)
    for n0 in range(0, kv_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < kv_end
        kv_off, kv_mask, slots = kv_block(req_to_token_ptr, row, r2t_stride, n, n_mask,
                                          kv_head, cache_stride_s, cache_stride_h, d, d_mask,
                                          EVEN_D)
        qk, vs = kv_scores(q, k_cache_ptr, kv_off, kv_mask, k_scale_ptr, v_scale_ptr, slots,
                           n_mask, kv_head, scale_stride_s, scale, KV_INT8, DOT_PRECISION)
        qk = tl.where(n_mask[None, :] & (n[None, :] <= q_pos[:, None]), qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(q, qk, v_cache_ptr, kv_off, kv_mask, m_i, l_i, acc,
                                            vs, KV_INT8, DOT_PRECISION)

    out = acc / l_i[:, None]
    o_off = (first_row + i)[:, None] * out_stride_t + head * out_stride_h + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty),
             mask=i_mask[:, None] & d_mask[None, :])


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int  # query rows per program
    block_n: int  # KV rows per inner step
    num_warps: int
    num_stages: int = 2


CONFIG_OVERRIDE: LaunchConfig | None = None  # set by benchmarks/gpu_check.py sweeps


def launch_config(head_dim: int) -> LaunchConfig:
    """Tiles that build without register spills for sm_90 (checked with cuobjdump):
    64 x 64 with 4 warps up to D=64, with 8 warps up to D=128, 32 x 32 above."""
    if CONFIG_OVERRIDE is not None:
        return CONFIG_OVERRIDE
    block_d = triton.next_power_of_2(head_dim)
    if block_d <= 64:
        return LaunchConfig(64, 64, 4)
    return LaunchConfig(64, 64, 8) if block_d <= 128 else LaunchConfig(32, 32, 8)


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    extend_start_loc: torch.Tensor | None = None,
    max_extend_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q [T, H, D]`` of ragged new tokens; returns ``[T, H, D]``. ``k_scale, v_scale``:
    int8 caches, as in ``decode_attention``. Optional:
    ``extend_start_loc`` (else the exclusive cumsum of ``extend_lens``), ``max_extend_len``
    (else a device sync to find it) and an ``out`` tensor."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q) if out is None else out
    batch = extend_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    if extend_start_loc is None:
        extend_start_loc = torch.cumsum(extend_lens, 0) - extend_lens
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max())
    block_d = triton.next_power_of_2(head_dim)
    config = launch_config(head_dim)
    grid = (batch, num_heads, triton.cdiv(max_extend_len, config.block_m))
    int8, k_scale, v_scale = scale_args(k_cache, v_cache, k_scale, v_scale)
    _extend_kernel[grid](
        q, out, k_cache, v_cache, k_scale, v_scale, req_to_token, req_pool_indices,
        prefix_lens, extend_lens, extend_start_loc,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_scale.stride(0), req_to_token.stride(0),
        scale, group, head_dim,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=block_d,
        EVEN_D=block_d == head_dim, KV_INT8=int8, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
