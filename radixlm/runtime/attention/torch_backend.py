"""CPU attention in plain torch over the paged KV pool.

The pool is the source of truth: every step stores its new K/V at ``out_cache_loc`` and
everything is addressable through ``req_to_token``. Gathering a batch's K/V through
``req_to_token`` on every layer of every decode step costs more than the attention math
on a CPU, so this backend also keeps a *row mirror*: per ``req_to_token`` row, a dense
copy ``[rows, capacity, Hkv, D]`` of that request's K/V. A request's mirror row is filled
from the pool once (when it is admitted, resumed or extended after a cache hit) and then
grows by one token per decode step, so decode reads K/V in place with one batched SDPA
call per layer. Rows are handed out lowest-first, so the running rows stay compact; the
few holes are masked out. When the mirror would exceed its memory budget, the backend
falls back to gathering through ``req_to_token``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.runtime.attention.base import AttentionBackend
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

DEFAULT_MIRROR_BYTES = 2 << 30


@dataclass
class _Meta:
    use_mirror: bool
    rows: torch.Tensor | None = None  # [B] rows of the batch (decode)
    num_rows: int = 0  # rows 0 .. num_rows - 1 cover the batch (decode)
    identity: bool = False  # the batch's rows are exactly 0 .. B-1, in order (decode)
    mask: torch.Tensor | None = None  # [num_rows or B, 1, 1, L] bool (decode)
    slot_idx: torch.Tensor | None = None  # [B, L] (decode, gather fallback)
    # extend: per request (first row in T, new tokens, prefix len, row, prefix slots)
    spans: list | None = None


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, pool, num_heads: int, num_kv_heads: int, head_dim: int,
                 mirror_budget_bytes: int | None = None) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim)
        num_layers = len(pool.k_buffer)
        self.num_rows, self.max_context = pool.req_to_token.shape
        self.token_bytes = (2 * num_layers * num_kv_heads * head_dim
                            * pool.k_buffer[0].element_size())
        default_budget = max(pool.capacity * self.token_bytes, DEFAULT_MIRROR_BYTES)
        self.mirror_budget = (default_budget if mirror_budget_bytes is None
                              else mirror_budget_bytes)
        self.mirror_len = 0
        self.mirror_k: list[torch.Tensor] = []
        self.mirror_v: list[torch.Tensor] = []
        self.owner = [None] * self.num_rows  # which request a row's mirror holds
        self.valid = [0] * self.num_rows  # mirror positions [0, valid) are up to date

    # ------------------------------------------------------------------ mirror
    def _ensure_mirror(self, needed: int) -> bool:
        if needed <= self.mirror_len:
            return True
        length = max(256, self.mirror_len)
        while length < needed:
            length *= 2
        length = min(length, self.max_context)
        if length < needed or self.num_rows * length * self.token_bytes > self.mirror_budget:
            return False
        shape = (self.num_rows, length, self.num_kv_heads, self.head_dim)
        old_k, old_v, old_len = self.mirror_k, self.mirror_v, self.mirror_len
        kw = {"dtype": self.pool.dtype, "device": self.pool.device}
        # zeros, not empty: masked positions still enter SDPA as 0 * V, and garbage V can
        # be NaN
        self.mirror_k = [torch.zeros(shape, **kw) for _ in self.pool.k_buffer]
        self.mirror_v = [torch.zeros(shape, **kw) for _ in self.pool.v_buffer]
        for new, old in zip(self.mirror_k + self.mirror_v, old_k + old_v):
            new[:, :old_len] = old
        self.mirror_len = length
        return True

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        rows = batch.req_pool_indices.tolist()
        use = self._ensure_mirror(batch.max_seq_len)
        if use:
            for row, owner, p in zip(rows, batch.owner_ids, batch.prefix_lens_cpu):
                if self.owner[row] != owner:
                    self.owner[row], self.valid[row] = owner, 0
                self.valid[row] = min(self.valid[row], p)
                if self.valid[row] < p:  # fill the mirror row from the pool, once
                    slots = self.pool.req_to_token[row, self.valid[row]:p].long()
                    for mk, mv, kc, vc in zip(self.mirror_k, self.mirror_v,
                                              self.pool.k_buffer, self.pool.v_buffer):
                        mk[row, self.valid[row]:p] = kc[slots]
                        mv[row, self.valid[row]:p] = vc[slots]
                self.valid[row] = p + (1 if batch.mode == ForwardMode.DECODE else 0)
            if batch.mode == ForwardMode.EXTEND:
                for row, s in zip(rows, batch.seq_lens_cpu):
                    self.valid[row] = s
        if batch.mode == ForwardMode.DECODE:
            max_len = batch.max_seq_len
            arange = torch.arange(max_len, device=batch.seq_lens.device)
            if use:
                num_rows = max(rows) + 1
                lens = torch.zeros(num_rows, dtype=torch.int64, device=batch.seq_lens.device)
                lens[batch.req_pool_indices] = batch.seq_lens
                mask = (arange[None, :] < lens[:, None])[:, None, None, :]
                batch.attn_metadata = _Meta(True, batch.req_pool_indices, num_rows, mask=mask,
                                            identity=rows == list(range(len(rows))))
            else:
                slot_idx = self.pool.req_to_token[batch.req_pool_indices, :max_len].long()
                mask = (arange[None, :] < batch.seq_lens[:, None])[:, None, None, :]
                batch.attn_metadata = _Meta(False, mask=mask, slot_idx=slot_idx)
            return
        spans, start = [], 0
        for row, n, p in zip(rows, batch.extend_lens_cpu, batch.prefix_lens_cpu):
            prefix = self.pool.req_to_token[row, :p].long() if (p > 0 and not use) else None
            spans.append((start, n, p, row, prefix))
            start += n
        batch.attn_metadata = _Meta(use, spans=spans)

    # ------------------------------------------------------------------ attention
    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.pool.k_buffer[layer_id], self.pool.v_buffer[layer_id]
        k_cache[batch.out_cache_loc] = k  # index_put casts if the pool dtype differs
        v_cache[batch.out_cache_loc] = v
        meta: _Meta = batch.attn_metadata
        if batch.mode == ForwardMode.DECODE:
            if meta.use_mirror:
                return self._decode_mirror(q, k, v, layer_id, batch, meta)
            return self._decode_gather(q, k_cache, v_cache, meta)
        return self._extend(q, k, v, k_cache, v_cache, layer_id, meta)

    def _decode_mirror(self, q, k, v, layer_id, batch, meta: _Meta) -> torch.Tensor:
        mk, mv = self.mirror_k[layer_id], self.mirror_v[layer_id]
        rows, pos = meta.rows, batch.seq_lens - 1
        mk[rows, pos] = k
        mv[rows, pos] = v
        length = batch.max_seq_len
        if meta.identity:  # the batch is rows 0 .. B-1 in order: no scatter/gather of q
            q_rows = q.unsqueeze(2)
        else:
            q_rows = q.new_zeros(meta.num_rows, self.num_heads, 1, self.head_dim)
            q_rows[rows] = q.unsqueeze(2)
        out = F.scaled_dot_product_attention(
            q_rows, mk[:meta.num_rows, :length].transpose(1, 2),
            mv[:meta.num_rows, :length].transpose(1, 2), attn_mask=meta.mask,
            scale=self.scale, enable_gqa=True)  # (rows, H, 1, D)
        return (out if meta.identity else out[rows]).squeeze(2)

    def _decode_gather(self, q, k_cache, v_cache, meta: _Meta) -> torch.Tensor:
        keys = k_cache[meta.slot_idx].transpose(1, 2)  # (B, Hkv, L, D)
        values = v_cache[meta.slot_idx].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=meta.mask, scale=self.scale,
            enable_gqa=True)
        return out.squeeze(2)

    def _extend(self, q, k, v, k_cache, v_cache, layer_id, meta: _Meta) -> torch.Tensor:
        out = torch.empty_like(q)
        for start, n, p, row, prefix_slots in meta.spans:
            qs = q[start:start + n].transpose(0, 1)  # (H, n, D)
            ks, vs = k[start:start + n], v[start:start + n]
            if meta.use_mirror:
                mk, mv = self.mirror_k[layer_id], self.mirror_v[layer_id]
                mk[row, p:p + n] = ks.to(mk.dtype)
                mv[row, p:p + n] = vs.to(mv.dtype)
            if p == 0:
                o = F.scaled_dot_product_attention(
                    qs[None], self._heads(ks), self._heads(vs), is_causal=True,
                    scale=self.scale)
            else:
                if meta.use_mirror:
                    keys, values = mk[row, :p + n], mv[row, :p + n]
                else:
                    keys = torch.cat([k_cache[prefix_slots], ks.to(k_cache.dtype)])
                    values = torch.cat([v_cache[prefix_slots], vs.to(v_cache.dtype)])
                mask = torch.ones(n, p + n, dtype=torch.bool, device=q.device).tril(diagonal=p)
                o = F.scaled_dot_product_attention(
                    qs[None], self._heads(keys), self._heads(values), attn_mask=mask,
                    scale=self.scale)
            out[start:start + n] = o[0].transpose(0, 1)
        return out

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[L, Hkv, D]`` -> ``[1, H, L, D]`` with KV heads repeated for GQA. SDPA's CPU
        flash kernel needs 4-D inputs with equal head counts; 3-D or ``enable_gqa`` falls
        back to the math path (measured 8x slower on a 512-token prefill)."""
        x = x.transpose(0, 1)
        group = self.num_heads // self.num_kv_heads
        return (x.repeat_interleave(group, dim=0) if group > 1 else x)[None]
