"""Batch-invariant attention in plain torch: the torch path's attention under
``enable_deterministic_inference``.

Contract: a query's output is the same bits whatever step computes it: its batch and its
neighbours, how its request's context was split into steps (chunked prefill, a prefix or
full cache hit, decode, a verify step), where it sits in the step. The K/V it reads are
the pool's (a key computed in this step or an earlier one, or copied back from a cache
tier, is the same bits), through ``req_to_token``, after the step's own K/V are stored.

How (fp32): a query token's ``g = H / Hkv`` query heads of one KV head are the rows of
one GEMM per block of ``KEY_BLOCK`` keys at absolute positions ``[b KB, (b + 1) KB)``:
scores ``[g, D] x [D, KB]``, values ``[g, KB] x [KB, D]``, the only shapes this backend
ever calls (``invariant.fixed_rows_linear`` says why a shape fixes a GEMM's order). The
softmax takes the exact max over the query's keys, masks later positions (and the window)
with -inf, and adds the blocks' partial sums and outputs as a pairwise tree over a
power-of-two count of blocks; the blocks past a query's last are the sum's identity
(-0.0), so the tree gives the same bits at any count, i.e. beside any longer context.

The same GEMMs in two layouts: queries of short spans (decode, a hit's last token, a
verify step: up to ``GATHER_MAX`` tokens of a request) get their key blocks gathered, all
in one batched call; a long span (a prefill chunk, in pieces of ``SPAN_TOKENS``) reads
its context once and calls per (KV head, block) with that block broadcast over its
queries, no copy. The operands have the same shapes, inner strides and 64-byte
alignment either way, and the library computes a batch entry alike at any batch size or
batch stride (tests/test_deterministic_torch.py compares the two layouts bit for bit).
Soft-capping and sliding windows (``AttnLayerOptions``) are applied to the scores. The
scores' exp and the soft-cap's tanh run over whole tensors: ATen gives an element of either
its bits wherever it falls in a call (``models.invariant.act_and_mul`` says why; tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixlm.kernels.ref import softcap
from radixlm.runtime.attention.base import AttentionBackend, AttnLayerOptions
from radixlm.runtime.forward_batch import ForwardBatch

KEY_BLOCK = 64  # keys per GEMM (one shape for every query)
GATHER_MAX = 8  # new tokens of a request up to which its queries gather their key blocks
SPAN_TOKENS = 512  # queries of a long span attended at once (bounds the score tensor)


@dataclass
class _Group:
    """Queries attended together: the step's token rows ``rows`` at positions ``pos``,
    their blocks counted up to ``nbp`` (a power of two). Gathered: entry ``e`` is block
    ``blk[e]`` of local query ``tok[e]``, its keys at pool ``slots[e]`` (padding: slot 0).
    A span: the context's slots ``ctx [nb * KB]`` and, per block, the first local query
    that reaches it (``first``)."""

    rows: torch.Tensor | slice
    pos: torch.Tensor
    nbp: int
    tok: torch.Tensor | None = None
    blk: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    ctx: torch.Tensor | None = None
    first: list[int] | None = None
    masks: dict = field(default_factory=dict)  # window -> allowed [n, nbp, KB]

    @property
    def n(self) -> int:
        return int(self.pos.shape[0])

    def allowed(self, window: int | None) -> torch.Tensor:
        mask = self.masks.get(window)
        if mask is None:
            kpos = torch.arange(self.nbp * KEY_BLOCK, device=self.pos.device)
            q = self.pos[:, None]
            mask = kpos[None, :] <= q
            if window is not None:
                mask &= kpos[None, :] > q - window
            mask = self.masks[window] = mask.view(self.n, self.nbp, KEY_BLOCK)
        return mask


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` (a power of two long) as a pairwise tree, halves first: trailing
    entries that are the identity leave the result as without them."""
    while x.shape[dim] > 1:
        half = x.shape[dim] // 2
        x = x.narrow(dim, 0, half) + x.narrow(dim, half, half)
    return x.squeeze(dim)


class InvariantAttentionBackend(AttentionBackend):
    supports_softcap_and_window = True

    def __init__(self, pool, num_heads: int, num_kv_heads: int, head_dim: int,
                 layers: list[AttnLayerOptions] | None = None) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim, layers)
        if head_dim % 16:  # (a query's rows then start 64-byte aligned in every layout)
            raise ValueError(f"enable_deterministic_inference cannot honour head_dim="
                             f"{head_dim} on the torch path (a multiple of 16 is needed)")
        self.group = num_heads // num_kv_heads

    # ------------------------------------------------------------------ the step's groups
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        rows = batch.req_pool_indices.tolist()
        short: list[tuple[int, int, int, int]] = []  # (row, first token, tokens, prefix)
        groups: list[_Group] = []
        start = 0
        for row, n, p in zip(rows, batch.extend_lens_cpu, batch.prefix_lens_cpu):
            if n <= GATHER_MAX:
                short.append((row, start, n, p))
            else:
                for a in range(0, n, SPAN_TOKENS):
                    groups.append(self._span(batch, row, start + a, min(SPAN_TOKENS, n - a),
                                             p + a))
            start += n
        if short:
            groups.append(self._gathered(batch, short))
        batch.attn_metadata = groups

    def _span(self, batch: ForwardBatch, row: int, start: int, n: int, p: int) -> _Group:
        """``n`` queries at positions ``p .. p + n - 1`` of one request (step rows from
        ``start``)."""
        nb = (p + n - 1) // KEY_BLOCK + 1
        ctx = torch.zeros(nb * KEY_BLOCK, dtype=torch.int64, device=batch.positions.device)
        ctx[:p + n] = self.pool.req_to_token[row, :p + n]
        first = [max(0, b * KEY_BLOCK - p) for b in range(nb)]
        return _Group(slice(start, start + n), batch.positions[start:start + n], _pow2(nb),
                      ctx=ctx, first=first)

    def _gathered(self, batch: ForwardBatch, short: list) -> _Group:
        dev = batch.positions.device
        rows, tok, blk, req, seq = [], [], [], [], []
        local = 0
        for row, start, n, p in short:
            rows.extend(range(start, start + n))
            for j in range(n):
                nb = (p + j) // KEY_BLOCK + 1
                tok.extend([local + j] * nb)
                blk.extend(range(nb))
                req.extend([row] * nb)
                seq.extend([p + n] * nb)
            local += n
        rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
        blk_t = torch.tensor(blk, dtype=torch.int64, device=dev)
        cols = blk_t[:, None] * KEY_BLOCK + torch.arange(KEY_BLOCK, device=dev)
        valid = cols < torch.tensor(seq, device=dev)[:, None]
        table = self.pool.req_to_token
        cols = cols.clamp_(max=table.shape[1] - 1)
        slots = table[torch.tensor(req, device=dev)[:, None], cols].long() * valid
        return _Group(rows_t, batch.positions[rows_t], _pow2(max(blk) + 1),
                      tok=torch.tensor(tok, dtype=torch.int64, device=dev), blk=blk_t,
                      slots=slots)

    # ------------------------------------------------------------------ attention
    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        self.pool.store(layer_id, batch.out_cache_loc, k, v)
        opt = self.layers[layer_id]
        qs = q.float() * opt.scale  # [T, H, D]
        out = torch.empty_like(q)
        for grp in batch.attn_metadata:
            qg = qs[grp.rows].view(grp.n, self.num_kv_heads, self.group, self.head_dim)
            o = self._attend(qg.transpose(0, 1).contiguous(), grp, layer_id, opt)
            out[grp.rows] = o.transpose(0, 1).reshape(grp.n, self.num_heads,
                                                      self.head_dim).to(q.dtype)
        return out

    def _blocks(self, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots [E, KB]`` as fp32 ``[Hkv, E, KB, D]``, contiguous."""
        k, v = self.pool.rows(layer_id, slots)  # [E, KB, Hkv, D]
        shape = (self.num_kv_heads, slots.shape[0], KEY_BLOCK, self.head_dim)
        return (torch.empty(shape, dtype=torch.float32, device=k.device).copy_(
                    k.permute(2, 0, 1, 3)),
                torch.empty(shape, dtype=torch.float32, device=v.device).copy_(
                    v.permute(2, 0, 1, 3)))

    def _attend(self, qh: torch.Tensor, grp: _Group, layer_id: int,
                opt: AttnLayerOptions) -> torch.Tensor:
        """``qh [Hkv, n, g, D]`` (scaled, fp32) -> ``[Hkv, n, g, D]`` fp32. Scores and
        outputs are kept per (KV head, block, query): one batch entry's rows contiguous."""
        hkv, n, g, d = qh.shape
        kb = KEY_BLOCK
        k, v = self._blocks(layer_id, grp.slots if grp.ctx is None
                            else grp.ctx.view(-1, kb))
        scores = qh.new_full((hkv, grp.nbp, n, g, kb), float("-inf"))
        if grp.ctx is None:  # entry e: block blk[e] of query tok[e]
            s = torch.bmm(qh[:, grp.tok].view(-1, g, d), k.view(-1, kb, d).transpose(1, 2))
            scores[:, grp.blk, grp.tok] = s.view(hkv, -1, g, kb)
        else:
            for b, j in enumerate(grp.first):
                for h in range(hkv):
                    key = k[h, b].t()[None].expand(n - j, d, kb)
                    torch.bmm(qh[h, j:], key, out=scores[h, b, j:])
        if opt.softcap is not None:
            scores = softcap(scores, opt.softcap)
        allowed = grp.allowed(opt.window).transpose(0, 1)  # [nbp, n, KB]
        scores.masked_fill_(~allowed[None, :, :, None, :], float("-inf"))
        probs = scores.sub_(scores.amax(dim=(1, 4), keepdim=True)).exp_()
        total = tree_sum(probs.sum(-1), 1)  # [Hkv, n, g]
        outs = qh.new_full((hkv, grp.nbp, n, g, d), -0.0)
        if grp.ctx is None:
            p = probs[:, grp.blk, grp.tok]  # [Hkv, E, g, KB]
            outs[:, grp.blk, grp.tok] = torch.bmm(p.view(-1, g, kb),
                                                  v.view(-1, kb, d)).view(hkv, -1, g, d)
        else:
            for b, j in enumerate(grp.first):
                for h in range(hkv):
                    value = v[h, b][None].expand(n - j, kb, d)
                    torch.bmm(probs[h, b, j:], value, out=outs[h, b, j:])
        return tree_sum(outs, 1) / total[..., None]
