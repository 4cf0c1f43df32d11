"""The KV block step both attention kernels run (``attention_decode``, ``attention_extend``).

A program streams the K/V rows of one request's KV head in blocks of ``BLOCK_N`` positions,
read in place through ``req_to_token``, with an online softmax over its query rows. These
device functions are inlined into each kernel where they are called; the kernels keep what
differs (which positions a block covers, and which of them each query row may see).

An int8 pool (``KV_INT8``) is read dequantized in registers: K and V load as int8 and are
cast to the query's dtype (exact: |q| <= 127), each key's bf16 scale multiplies its score
column (``qk * k_scale``) and each value's scale its softmax weight (``p * v_scale``)
before ``P @ V``, which is ``q . (k_scale k)`` and ``sum p (v_scale v)`` up to rounding.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kv_block(req_to_token_ptr, row, r2t_stride, n, n_mask, kv_head, cache_stride_s,
             cache_stride_h, d, d_mask, EVEN_D: tl.constexpr):
    """``(kv_off, kv_mask, slots)``: where positions ``n`` (``[BLOCK_N]``, valid under
    ``n_mask``) of pool row ``row`` keep head ``kv_head``'s dims ``d`` in the K/V caches, and
    their pool slots (int64)."""
    slots = tl.load(req_to_token_ptr + row * r2t_stride + n, mask=n_mask, other=0).to(tl.int64)
    kv_off = slots[:, None] * cache_stride_s + kv_head * cache_stride_h + d[None, :]
    if EVEN_D:  # a row mask only, so whole rows load as vectors
        kv_mask = n_mask[:, None]
    else:
        kv_mask = n_mask[:, None] & d_mask[None, :]
    return kv_off, kv_mask, slots


@triton.jit
def kv_scores(q, k_cache_ptr, kv_off, kv_mask, k_scale_ptr, v_scale_ptr, slots, n_mask,
              kv_head, scale_stride_s, scale, KV_INT8: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    """``(qk, vs)``: the scores ``q . k * scale`` of the block's keys (``[rows, BLOCK_N]``,
    not yet masked) and, for an int8 pool, the V row scales ``[BLOCK_N]`` fp32 that
    ``online_softmax_step`` folds into the weights (0.0 otherwise)."""
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0)
    if KV_INT8:  # int8 -> fp32 -> q's dtype, exact (and what the interpreter can do)
        k = k.to(tl.float32)
    qk = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=DOT_PRECISION) * scale
    vs = 0.0
    if KV_INT8:  # the rows' bf16 scales at these slots, 0 where n_mask is off
        off = slots * scale_stride_s + kv_head
        ks = tl.load(k_scale_ptr + off, mask=n_mask, other=0.0).to(tl.float32)
        vs = tl.load(v_scale_ptr + off, mask=n_mask, other=0.0).to(tl.float32)
        qk = qk * ks[None, :]
    return qk, vs


@triton.jit
def online_softmax_step(q, qk, v_cache_ptr, kv_off, kv_mask, m_i, l_i, acc, vs,
                        KV_INT8: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One block of the online softmax: scores ``qk [rows, BLOCK_N]`` (-inf where a row may
    not look) into the running max ``m_i``, sum ``l_i`` and output ``acc`` of the rows;
    the block's V rows are loaded at ``kv_off`` (as ``q``'s dtype), scaled by ``vs
    [BLOCK_N]`` where ``KV_INT8``. Returns the three."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0)
    if KV_INT8:
        v = v.to(tl.float32)  # then to q's dtype, exact
        p = p * vs[None, :]
    v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


def scale_args(k_cache, v_cache, k_scale, v_scale):
    """``(KV_INT8, k_scale, v_scale)`` for a launch: the scales of an int8 pool, else the
    caches as placeholders the kernel never reads."""
    if k_scale is None:
        return False, k_cache, v_cache
    return True, k_scale, v_scale
