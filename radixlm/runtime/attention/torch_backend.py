"""CPU attention in plain torch, reading K/V through ``req_to_token``.

Decode: one batched SDPA call per layer over a padded ``[B, L]`` slot-index matrix built
once per step. Extend: per request, SDPA of its new tokens over its prefix (read from the
pool) and itself, causal; a request with no prefix attends to this step's K/V directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode


@dataclass
class _DecodeMeta:
    slot_idx: torch.Tensor  # [B, L] int64, padded with slot 0
    mask: torch.Tensor  # [B, 1, 1, L] bool, True where attended


@dataclass
class _ExtendMeta:
    # per request: (first row in T, new tokens, prefix len, slot indices of the prefix or None)
    spans: list[tuple[int, int, int, torch.Tensor | None]]


class TorchAttentionBackend(AttentionBackend):
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        table = self.pool.req_to_token
        if batch.mode == ForwardMode.DECODE:
            max_len = batch.max_seq_len
            slot_idx = table[batch.req_pool_indices, :max_len].long()
            arange = torch.arange(max_len, device=slot_idx.device)
            mask = arange[None, :] < batch.seq_lens[:, None]
            batch.attn_metadata = _DecodeMeta(slot_idx, mask[:, None, None, :])
            return
        spans, start = [], 0
        rows = batch.req_pool_indices.tolist()
        for row, n, p in zip(rows, batch.extend_lens_cpu, batch.prefix_lens_cpu):
            prefix_slots = table[row, :p].long() if p > 0 else None
            spans.append((start, n, p, prefix_slots))
            start += n
        batch.attn_metadata = _ExtendMeta(spans)

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.pool.k_buffer[layer_id], self.pool.v_buffer[layer_id]
        k_cache[batch.out_cache_loc] = k.to(k_cache.dtype)
        v_cache[batch.out_cache_loc] = v.to(v_cache.dtype)
        if batch.mode == ForwardMode.DECODE:
            return self._decode(q, k_cache, v_cache, batch.attn_metadata)
        return self._extend(q, k, v, k_cache, v_cache, batch.attn_metadata)

    def _decode(self, q, k_cache, v_cache, meta: _DecodeMeta) -> torch.Tensor:
        keys = k_cache[meta.slot_idx].transpose(1, 2)  # (B, Hkv, L, D)
        values = v_cache[meta.slot_idx].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=meta.mask, scale=self.scale,
            enable_gqa=True,
        )  # (B, H, 1, D)
        return out.squeeze(2)

    def _extend(self, q, k, v, k_cache, v_cache, meta: _ExtendMeta) -> torch.Tensor:
        out = torch.empty_like(q)
        for start, n, p, prefix_slots in meta.spans:
            qs = q[start:start + n].transpose(0, 1)  # (H, n, D)
            ks, vs = k[start:start + n], v[start:start + n]
            if prefix_slots is None:
                o = F.scaled_dot_product_attention(
                    qs, ks.transpose(0, 1), vs.transpose(0, 1), is_causal=True,
                    scale=self.scale, enable_gqa=True)
            else:
                keys = torch.cat([k_cache[prefix_slots], ks.to(k_cache.dtype)]).transpose(0, 1)
                values = torch.cat([v_cache[prefix_slots], vs.to(v_cache.dtype)]).transpose(0, 1)
                mask = torch.ones(n, p + n, dtype=torch.bool, device=q.device).tril(diagonal=p)
                o = F.scaled_dot_product_attention(
                    qs, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=True)
            out[start:start + n] = o.transpose(0, 1)
        return out
