"""Attention through the Triton kernels: KV store, split-K paged decode, ragged extend.

All per-step host work (split counts, stage-1 buffers, the longest extend) happens once in
``init_forward_metadata`` from the ``*_cpu`` lists, so the per-layer ``forward`` launches
kernels only and never synchronizes with the device. An int8 pool is stored quantized by
the store kernel and read dequantized in the attention kernels' registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.kernels.attention_decode import (
    alloc_decode_buffers,
    choose_num_kv_splits,
    decode_attention,
)
from radixlm.kernels.attention_extend import extend_attention
from radixlm.kernels.kv_store import store_kv, store_kv_int8
from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode


@dataclass
class TritonDecodeMetadata:
    num_kv_splits: int
    mid_o: torch.Tensor  # [B, H, splits, D] fp32, shared by all layers of the step
    mid_lse: torch.Tensor  # [B, H, splits] fp32


@dataclass
class TritonExtendMetadata:
    max_extend_len: int


class TritonAttentionBackend(AttentionBackend):
    """``forward`` stores the step's K/V in the pool, then runs the decode kernel (one new
    token per request) or the extend kernel (new tokens after a cached prefix)."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode == ForwardMode.DECODE:
            splits = choose_num_kv_splits(batch.batch_size, self.num_kv_heads, batch.max_seq_len)
            mid_o, mid_lse = alloc_decode_buffers(
                batch.batch_size, self.num_heads, self.head_dim, splits, batch.input_ids.device
            )
            batch.attn_metadata = TritonDecodeMetadata(splits, mid_o, mid_lse)
        else:
            max_extend = max(batch.extend_lens_cpu) if batch.extend_lens_cpu else 0
            batch.attn_metadata = TritonExtendMetadata(max_extend)

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        k_cache = self.pool.k_buffer[layer_id]
        v_cache = self.pool.v_buffer[layer_id]
        k_scale, v_scale = self.pool.scales(layer_id)
        if k_scale is None:
            store_kv(k_cache, v_cache, batch.out_cache_loc, k, v)
        else:
            store_kv_int8(k_cache, v_cache, k_scale, v_scale, batch.out_cache_loc, k, v)
        if batch.attn_metadata is None:
            self.init_forward_metadata(batch)
        meta = batch.attn_metadata
        if batch.mode == ForwardMode.DECODE:
            return decode_attention(
                q, k_cache, v_cache, self.pool.req_to_token, batch.req_pool_indices,
                batch.seq_lens, self.layers[layer_id].scale, k_scale, v_scale,
                num_kv_splits=meta.num_kv_splits, buffers=(meta.mid_o, meta.mid_lse),
            )
        return extend_attention(
            q, k_cache, v_cache, self.pool.req_to_token, batch.req_pool_indices,
            batch.prefix_lens, batch.extend_lens, self.layers[layer_id].scale, k_scale, v_scale,
            extend_start_loc=batch.extend_start_loc, max_extend_len=meta.max_extend_len,
        )
