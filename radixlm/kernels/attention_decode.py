"""Paged decode attention with split-K in Triton. Twin: ``ref.decode_attention``.

Each request has one new query token and reads its K/V in place through ``req_to_token``
(a radix-shared prefix is never gathered or copied). Long contexts are cut into
``num_kv_splits`` pieces so a small batch still fills the GPU:

* stage 1, grid ``(B, Hkv, splits)``: the query heads of one KV group attend to one piece
  with an online softmax; writes the piece's normalized output and its log-sum-exp.
* stage 2, grid ``(B, H)``: merges the pieces by their log-sum-exp.

Every K/V row is read once per step by the one program owning its (request, KV head, piece);
the ``G = H / Hkv`` query heads of a group share it through one ``tl.dot``.
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

MIN_SPLIT_LEN = 256  # do not cut contexts into pieces shorter than this
TARGET_PROGRAMS = 4 * 132  # about four stage-1 programs per SM of an H100/H200


@dataclass(frozen=True)
class LaunchConfig:
    """Stage-1 tile and launch shape. The default builds for sm_90 at 168 registers and a
    16-byte stack (BLOCK_N 64 with 4 warps needs 255 and spills more); guessed without a GPU:
    ``benchmarks/gpu_check.py`` sweeps others by setting ``CONFIG_OVERRIDE``."""

    block_n: int = 32  # KV rows per inner step
    num_warps: int = 4
    num_stages: int = 2


CONFIG_OVERRIDE: LaunchConfig | None = None


def launch_config(head_dim: int) -> LaunchConfig:
    return CONFIG_OVERRIDE or LaunchConfig()


@triton.jit
def _decode_stage1_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, req_to_token_ptr,
    req_pool_indices_ptr, seq_lens_ptr, mid_o_ptr, mid_lse_ptr,
    q_stride_b, q_stride_h, cache_stride_s, cache_stride_h, scale_stride_s, r2t_stride,
    mid_o_stride_b, mid_o_stride_h, mid_o_stride_s, mid_lse_stride_b, mid_lse_stride_h,
    scale, group, head_dim, num_splits,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr, KV_INT8: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    split_len = tl.cdiv(seq_len, num_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    heads = kv_head * group + tl.arange(0, BLOCK_H)  # the query heads of this KV group
    head_mask = tl.arange(0, BLOCK_H) < group
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    q = tl.load(q_ptr + b.to(tl.int64) * q_stride_b + heads[:, None] * q_stride_h + d[None, :],
                mask=head_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        kv_off, kv_mask, slots = kv_block(req_to_token_ptr, row, r2t_stride, n, n_mask,
                                          kv_head, cache_stride_s, cache_stride_h, d, d_mask,
                                          EVEN_D)
        qk, vs = kv_scores(q, k_cache_ptr, kv_off, kv_mask, k_scale_ptr, v_scale_ptr, slots,
                           n_mask, kv_head, scale_stride_s, scale, KV_INT8, DOT_PRECISION)
        qk = tl.where(n_mask[None, :], qk, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_i, l_i, acc = online_softmax_step(q, qk, v_cache_ptr, kv_off, kv_mask, m_i, l_i, acc,
                                            vs, KV_INT8, DOT_PRECISION)

    if end > start:
        o_off = (b.to(tl.int64) * mid_o_stride_b + heads[:, None] * mid_o_stride_h
                 + split * mid_o_stride_s + d[None, :])
        tl.store(mid_o_ptr + o_off, acc / l_i[:, None], mask=head_mask[:, None] & d_mask[None, :])
        lse_off = b.to(tl.int64) * mid_lse_stride_b + heads * mid_lse_stride_h + split
        tl.store(mid_lse_ptr + lse_off, m_i + tl.log(l_i), mask=head_mask)


@triton.jit
def _decode_stage2_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, seq_lens_ptr,
    mid_o_stride_b, mid_o_stride_h, mid_o_stride_s, mid_lse_stride_b, mid_lse_stride_h,
    out_stride_b, out_stride_h,
    head_dim, num_splits,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    split_len = tl.cdiv(seq_len, num_splits)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s in range(0, num_splits):
        if s * split_len < seq_len:  # pieces past the end were never written
            lse = tl.load(mid_lse_ptr + b * mid_lse_stride_b + head * mid_lse_stride_h + s)
            o = tl.load(mid_o_ptr + b * mid_o_stride_b + head * mid_o_stride_h
                        + s * mid_o_stride_s + d, mask=d_mask, other=0.0)
            m_new = tl.maximum(m_i, lse)
            alpha = tl.exp(m_i - m_new)
            w = tl.exp(lse - m_new)
            acc = acc * alpha + w * o
            l_i = l_i * alpha + w
            m_i = m_new
    out = acc / l_i
    tl.store(out_ptr + b * out_stride_b + head * out_stride_h + d,
             out.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_kv_splits(batch_size: int, num_kv_heads: int, max_seq_len: int,
                         max_splits: int = 32) -> int:
    """Enough pieces that ``B * Hkv * splits`` about fills the GPU, none shorter than
    ``MIN_SPLIT_LEN`` rows (a short piece costs more in stage 2 than it saves)."""
    want = triton.cdiv(TARGET_PROGRAMS, max(1, batch_size * num_kv_heads))
    return max(1, min(want, triton.cdiv(max_seq_len, MIN_SPLIT_LEN), max_splits))


def alloc_decode_buffers(batch_size: int, num_heads: int, head_dim: int, num_kv_splits: int,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage-1 outputs ``mid_o [B, H, splits, D]`` and ``mid_lse [B, H, splits]`` (fp32);
    reusable across layers of one step."""
    mid_o = torch.empty(batch_size, num_heads, num_kv_splits, head_dim,
                        dtype=torch.float32, device=device)
    mid_lse = torch.empty(batch_size, num_heads, num_kv_splits,
                          dtype=torch.float32, device=device)
    return mid_o, mid_lse


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    num_kv_splits: int | None = None,
    max_seq_len: int | None = None,
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q [B, H, D]``; request ``b`` attends to slots
    ``req_to_token[req_pool_indices[b], :seq_lens[b]]`` (every ``seq_lens[b] >= 1``).
    Returns ``[B, H, D]``. ``k_scale, v_scale [S, Hkv]``: the caches are int8 with these
    row scales (``ref.quantize_kv``), read dequantized. Optional: ``num_kv_splits`` (else
    chosen from ``max_seq_len``, which costs a device sync when not given), stage-1
    ``buffers`` from ``alloc_decode_buffers`` and an ``out`` tensor, so a caller can avoid
    per-layer work."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    if num_kv_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        num_kv_splits = choose_num_kv_splits(batch, num_kv_heads, max_seq_len)
    if buffers is None:
        buffers = alloc_decode_buffers(batch, num_heads, head_dim, num_kv_splits, q.device)
    mid_o, mid_lse = buffers
    block_d = triton.next_power_of_2(head_dim)
    config = launch_config(head_dim)
    int8, k_scale, v_scale = scale_args(k_cache, v_cache, k_scale, v_scale)
    _decode_stage1_kernel[(batch, num_kv_heads, num_kv_splits)](
        q, k_cache, v_cache, k_scale, v_scale, req_to_token, req_pool_indices, seq_lens,
        mid_o, mid_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_scale.stride(0),
        req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        scale, group, head_dim, num_kv_splits,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=config.block_n,
        BLOCK_D=block_d, EVEN_D=block_d == head_dim, KV_INT8=int8,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    _decode_stage2_kernel[(batch, num_heads)](
        mid_o, mid_lse, out, seq_lens,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        head_dim, num_kv_splits,
        BLOCK_D=block_d, num_warps=1,
    )
    return out
