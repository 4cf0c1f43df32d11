"""The KV block step both attention kernels run (``attention_decode``, ``attention_extend``).

A program streams the K/V rows of one request's KV head in blocks of ``BLOCK_N`` positions,
read in place through ``req_to_token``, with an online softmax over its query rows. These
device functions are inlined into each kernel where they are called; the kernels keep what
differs (which positions a block covers, and which of them each query row may see).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kv_block(req_to_token_ptr, row, r2t_stride, n, n_mask, kv_head, cache_stride_s,
             cache_stride_h, d, d_mask, EVEN_D: tl.constexpr):
    """``(kv_off, kv_mask)``: where positions ``n`` (``[BLOCK_N]``, valid under ``n_mask``)
    of pool row ``row`` keep head ``kv_head``'s dims ``d`` in the K/V caches."""
    slots = tl.load(req_to_token_ptr + row * r2t_stride + n, mask=n_mask, other=0)
    kv_off = (slots.to(tl.int64)[:, None] * cache_stride_s + kv_head * cache_stride_h
              + d[None, :])
    if EVEN_D:  # a row mask only, so whole rows load as vectors
        kv_mask = n_mask[:, None]
    else:
        kv_mask = n_mask[:, None] & d_mask[None, :]
    return kv_off, kv_mask


@triton.jit
def online_softmax_step(q, qk, v_cache_ptr, kv_off, kv_mask, m_i, l_i, acc,
                        DOT_PRECISION: tl.constexpr):
    """One block of the online softmax: scores ``qk [rows, BLOCK_N]`` (-inf where a row may
    not look) into the running max ``m_i``, sum ``l_i`` and output ``acc`` of the rows;
    the block's V rows are loaded at ``kv_off`` (as ``q``'s dtype). Returns the three."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
