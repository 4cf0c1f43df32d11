"""CPU attention in plain torch over the paged KV pool.

The pool is the source of truth: every step stores its new K/V at ``out_cache_loc`` and
everything is addressable through ``req_to_token``. Gathering a batch's K/V through
``req_to_token`` on every layer of every decode step costs more than the attention math
on a CPU, so this backend also keeps a *mirror*: per running request, a dense copy of its
K/V in one of ``[slots, capacity, Hkv, D]`` mirror slots. A request's mirror slot is filled
from the pool once (when it is admitted, resumed or extended after a cache hit) and then
grows by one token per decode step, so decode reads K/V in place with batched SDPA calls.
Mirror slots belong to requests (not to ``req_to_token`` rows) and a decode step first
moves the batch into slots ``0 .. B-1`` (a copy of one request's K/V when another
finished below it), so decode is one SDPA call with no holes however requests come and
go. Slots of requests that are not in the step are reused least-recently-used first (a
request that comes back is refilled from the pool). When the mirror would exceed its
memory budget, the backend falls back to gathering through ``req_to_token``.

Layers with attention soft-capping or a sliding window (``AttnLayerOptions``) take the same
paths; their mask is built from the query positions (a key's index is its position in
every path) and soft-capped scores are computed outside SDPA, which has no soft-cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.kernels.ref import softcap
from radixlm.runtime.attention.base import AttentionBackend, AttnLayerOptions
from radixlm.runtime.attention.mirror_slots import MirrorSlots
from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

DEFAULT_MIRROR_BYTES = 2 << 30


@dataclass
class _DecodeGroup:
    """Entries that add one token after a prefix, attended in one SDPA call over mirror
    slots ``lo .. hi-1`` read in place (slots between the entries attend to nothing and
    are dropped; a decode step has none, its batch is packed into 0 .. B-1)."""

    t_idx: torch.Tensor | None  # rows of q/k/v in the step (None: all of them, in order)
    slots: torch.Tensor  # [n] mirror slots, step order
    pos: torch.Tensor  # [n] position of the new token
    lo: int
    hi: int
    length: int  # longest entry, new token included
    # [hi - lo, 1] position of each slot's new token (holes: 0); None when all layers are plain
    row_pos: torch.Tensor | None
    local: torch.Tensor | None  # slots - lo in step order; None when that is 0 .. n-1
    mask: torch.Tensor | None  # [hi - lo, 1, 1, length] additive, None when no padding


@dataclass
class _Meta:
    use_mirror: bool
    group: _DecodeGroup | None = None  # one-token entries (decode, or n == 1 in extend)
    mask: torch.Tensor | None = None  # [B, 1, 1, L] additive (decode, gather fallback)
    slot_idx: torch.Tensor | None = None  # [B, L] (decode, gather fallback)
    # extend: per request with n > 1 or no prefix (first row in T, new tokens, prefix
    # len, mirror slot, prefix pool slots or None, causal additive mask [n, p + n] or None
    # if p == 0)
    spans: list | None = None


class TorchAttentionBackend(AttentionBackend):
    supports_softcap_and_window = True

    def __init__(self, pool, num_heads: int, num_kv_heads: int, head_dim: int,
                 mirror_budget_bytes: int | None = None,
                 layers: list[AttnLayerOptions] | None = None) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim, layers)
        self.all_plain = all(o.plain for o in self.layers)
        num_layers = len(pool.k_buffer)
        self.num_rows, self.max_context = pool.req_to_token.shape
        self.token_bytes = (2 * num_layers * num_kv_heads * head_dim
                            * torch.empty(0, dtype=pool.dtype).element_size())
        default_budget = max(pool.capacity * self.token_bytes, DEFAULT_MIRROR_BYTES)
        self.mirror_budget = (default_budget if mirror_budget_bytes is None
                              else mirror_budget_bytes)
        self.mirror_len = 0
        self.mirror_k: list[torch.Tensor] = []
        self.mirror_v: list[torch.Tensor] = []
        self.slots = MirrorSlots(self.num_rows)  # as many as rows: a batch always fits

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

    def _place(self, owners: list[int], compact: bool) -> list[int]:
        """Mirror slot of each request of the step (see ``MirrorSlots.place``), after
        copying the K/V of the requests that move."""
        slots, moves = self.slots.place(owners, compact)
        for src, dst, n in moves:
            for buf in self.mirror_k + self.mirror_v:
                buf[dst, :n] = buf[src, :n]
        return slots

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        rows = batch.req_pool_indices.tolist()
        use = self._ensure_mirror(batch.max_seq_len)
        decode = batch.mode == ForwardMode.DECODE
        mslots = self._place(batch.owner_ids, compact=decode) if use else rows
        if use:
            valid = self.slots.valid
            for row, m, p in zip(rows, mslots, batch.prefix_lens_cpu):
                valid[m] = min(valid[m], p)
                if valid[m] < p:  # fill the mirror slot from the pool, once
                    pool_slots = self.pool.req_to_token[row, valid[m]:p].long()
                    for layer, (mk, mv) in enumerate(zip(self.mirror_k, self.mirror_v)):
                        mk[m, valid[m]:p], mv[m, valid[m]:p] = self.pool.rows(layer,
                                                                              pool_slots)
                valid[m] = p + (1 if decode else 0)
            if not decode:
                for m, seq in zip(mslots, batch.seq_lens_cpu):
                    valid[m] = seq
        else:  # this step is not mirrored: what a mirror slot holds stays valid up to p
            for owner, p in zip(batch.owner_ids, batch.prefix_lens_cpu):
                m = self.slots.slot_of.get(owner)
                if m is not None:
                    self.slots.valid[m] = min(self.slots.valid[m], p)
        if decode and not use:
            max_len = batch.max_seq_len
            arange = torch.arange(max_len, device=batch.seq_lens.device)
            slot_idx = self.pool.req_to_token[batch.req_pool_indices, :max_len].long()
            mask = self._additive((arange[None, :] < batch.seq_lens[:, None])[:, None, None, :])
            batch.attn_metadata = _Meta(False, mask=mask, slot_idx=slot_idx)
            return
        spans, one_token, start = [], [], 0
        for row, m, n, p in zip(rows, mslots, batch.extend_lens_cpu, batch.prefix_lens_cpu):
            if use and n == 1 and p > 0:
                one_token.append((start, m, p + 1))
            else:
                prefix = self.pool.req_to_token[row, :p].long() if (p > 0 and not use) else None
                mask = None if p == 0 else self._additive(torch.ones(
                    n, p + n, dtype=torch.bool, device=batch.seq_lens.device).tril(diagonal=p))
                spans.append((start, n, p, m, prefix, mask))
            start += n
        group = self._decode_group(one_token, not spans, batch.seq_lens.device)
        batch.attn_metadata = _Meta(use, group=group, spans=spans)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """Bool mask -> 0 / -inf in the K/V dtype, made once per step: SDPA converts a
        bool mask on every call (every layer), ~5% of a batch-64 decode attention."""
        return torch.zeros(allowed.shape, dtype=self.pool.dtype,
                           device=allowed.device).masked_fill_(~allowed, float("-inf"))

    def _decode_group(self, entries: list[tuple[int, int, int]], whole: bool,
                      device) -> _DecodeGroup | None:
        """``entries``: (row in the step, mirror slot, length incl. the new token) of the
        one-token entries; ``whole``: they are all of the step's rows."""
        if not entries:
            return None

        def tensor(values):
            return torch.tensor(values, dtype=torch.int64, device=device)

        slots = [e[1] for e in entries]
        lens = [e[2] for e in entries]
        lo, hi, length = min(slots), max(slots) + 1, max(lens)
        in_order = slots == list(range(lo, hi))
        mask = row_lens = None
        if not in_order or min(lens) != length or not self.all_plain:
            row_lens = [0] * (hi - lo)  # holes attend to nothing
            for m, n in zip(slots, lens):
                row_lens[m - lo] = n
            row_lens = tensor(row_lens)
        if not in_order or min(lens) != length:
            arange = torch.arange(length, device=device)
            mask = self._additive((arange[None, :] < row_lens[:, None])[:, None, None, :])
        return _DecodeGroup(
            t_idx=None if whole else tensor([e[0] for e in entries]),
            slots=tensor(slots), pos=tensor([n - 1 for n in lens]), lo=lo, hi=hi,
            length=length, local=None if in_order else tensor([m - lo for m in slots]),
            mask=mask, row_pos=None if self.all_plain else (row_lens - 1).clamp_(min=0)[:, None])

    # ------------------------------------------------------------------ attention
    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        # the step's own K/V as the pool keeps them (int8: quantized and back), so this
        # step attends to them as every later step and the other paths will
        k, v = self.pool.store(layer_id, batch.out_cache_loc, k, v)
        meta: _Meta = batch.attn_metadata
        if not meta.use_mirror and batch.mode == ForwardMode.DECODE:
            return self._decode_gather(q, layer_id, batch, meta)
        group = meta.group
        if group is not None and group.t_idx is None:
            return self._decode_mirror(q, k, v, layer_id, group)
        out = torch.empty_like(q)
        if meta.spans:
            self._extend(q, k, v, layer_id, batch, meta, out)
        if group is not None:
            idx = group.t_idx
            out[idx] = self._decode_mirror(q[idx], k[idx], v[idx], layer_id, group)
        return out

    def _decode_mirror(self, q, k, v, layer_id, group: _DecodeGroup) -> torch.Tensor:
        """One new token per entry, one batched SDPA call reading the mirror in place."""
        mk, mv = self.mirror_k[layer_id], self.mirror_v[layer_id]
        mk[group.slots, group.pos] = k
        mv[group.slots, group.pos] = v
        if group.local is not None:  # scatter q over the slot range (holes stay zero)
            q = q.new_zeros(group.hi - group.lo, self.num_heads, self.head_dim).index_copy_(
                0, group.local, q)
        window = slice(group.lo, group.hi)
        o = self._sdpa(
            q.unsqueeze(2), mk[window, :group.length].transpose(1, 2),
            mv[window, :group.length].transpose(1, 2), layer_id, group.row_pos,
            mask=group.mask).squeeze(2)  # (rows, H, D)
        return o if group.local is None else o[group.local]

    def _decode_gather(self, q, layer_id, batch, meta: _Meta):
        keys, values = self.pool.rows(layer_id, meta.slot_idx)  # (B, L, Hkv, D)
        keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # (B, Hkv, L, D)
        out = self._sdpa(q.unsqueeze(2), keys, values, layer_id, batch.positions[:, None],
                         mask=meta.mask)
        return out.squeeze(2)

    def _extend(self, q, k, v, layer_id, batch, meta: _Meta, out) -> None:
        for start, n, p, slot, prefix_slots, mask in meta.spans:
            qs = q[start:start + n].transpose(0, 1)  # (H, n, D)
            ks, vs = k[start:start + n], v[start:start + n]
            if meta.use_mirror:
                mk, mv = self.mirror_k[layer_id], self.mirror_v[layer_id]
                mk[slot, p:p + n] = ks.to(mk.dtype)
                mv[slot, p:p + n] = vs.to(mv.dtype)
            q_pos = batch.positions[None, start:start + n]
            if p == 0:
                o = self._sdpa(qs[None], self._heads(ks), self._heads(vs), layer_id, q_pos,
                               causal=True)
            else:
                if meta.use_mirror:
                    keys, values = mk[slot, :p + n], mv[slot, :p + n]
                else:
                    prefix_k, prefix_v = self.pool.rows(layer_id, prefix_slots)
                    keys = torch.cat([prefix_k, ks.to(prefix_k.dtype)])
                    values = torch.cat([prefix_v, vs.to(prefix_v.dtype)])
                o = self._sdpa(qs[None], self._heads(keys), self._heads(values), layer_id,
                               q_pos, mask=mask)
            out[start:start + n] = o[0].transpose(0, 1)

    def _sdpa(self, q, k, v, layer_id: int, q_pos: torch.Tensor, mask=None,
              causal: bool = False) -> torch.Tensor:
        """Attention of ``q [B, H, Lq, D]`` over ``k, v [B, H or Hkv, Lk, D]`` whose key
        ``j`` sits at position ``j``. A plain layer uses ``mask`` (additive) or ``causal``
        as given; a soft-capped or sliding-window layer builds its mask from ``q_pos
        [B or 1, Lq]`` (positions of the queries), which also covers causality and
        padding (padded keys lie past every query of their row)."""
        opt = self.layers[layer_id]
        gqa = k.shape[1] != q.shape[1]
        if opt.plain:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  scale=opt.scale, enable_gqa=gqa)
        k_pos = torch.arange(k.shape[2], device=q.device)
        allowed = k_pos <= q_pos[..., None]  # [B | 1, Lq, Lk]
        if opt.window is not None:
            allowed &= k_pos > q_pos[..., None] - opt.window
        allowed = allowed[:, None]  # broadcast over heads
        if opt.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=opt.scale,
                                                  enable_gqa=gqa)
        if gqa:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q.float() @ k.float().transpose(-1, -2)) * opt.scale
        scores = softcap(scores, opt.softcap)
        probs = scores.masked_fill_(~allowed, float("-inf")).softmax(-1)
        return (probs @ v.float()).to(q.dtype)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[L, Hkv, D]`` -> ``[1, H, L, D]`` with KV heads repeated for GQA. SDPA's CPU
        flash kernel needs 4-D inputs with equal head counts; 3-D or ``enable_gqa`` falls
        back to the math path (measured 8x slower on a 512-token prefill)."""
        x = x.transpose(0, 1)
        group = self.num_heads // self.num_kv_heads
        return (x.repeat_interleave(group, dim=0) if group > 1 else x)[None]
