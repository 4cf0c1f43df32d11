"""Batched sampling: one call per step, per-row parameters that never leak across rows.

Order of operations on the fp32 logits ``[B, V]``: penalties (repetition, frequency,
presence) -> logit bias -> banned tokens (``min_new_tokens`` blocks EOS/stop ids) ->
grammar bitmask -> logprobs (of this processed, masked distribution, before temperature)
-> greedy argmax, or temperature, top-k, top-p, min-p and a draw from the request's own
seeded generator (so a seed gives the same draws whatever else is in the batch, and the
same text while the logits are the same bits: the native path rounds a row by its step's
size class alone, the torch path's BLAS by the row count of the GEMM it is in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Top-k/top-p/min-p are first tried on this many best candidates; a row whose kept set does
# not fit falls back to a full sort, so the result is always exact.
_CANDIDATES = 256


@dataclass
class SamplingInputs:
    """Per-row parameters, built by the model runner from requests."""

    temperatures: list[float]
    top_ks: list[int]
    top_ps: list[float]
    min_ps: list[float]
    frequency_penalties: list[float]
    presence_penalties: list[float]
    repetition_penalties: list[float]
    output_ids: list[list[int]]  # per row, for frequency/presence penalties
    seen_ids: list[list[int]] | None  # prompt + output, only when a repetition penalty is set
    banned_ids: list[list[int]]  # per row, tokens masked this step (min_new_tokens)
    generators: list[torch.Generator | None]  # None: greedy row
    top_logprobs_nums: list[int]  # -1: no logprobs for this row
    bitmask: torch.Tensor | None = None  # [B, ceil(V/32)] int32 or None
    logit_biases: list[dict[int, float] | None] | None = None  # per row, added to the logits
    # per row, tokens seen after ``seen_ids[row]`` (a verification row's earlier draft
    # tokens); the rows of one request share one ``seen_ids`` list, counted once
    seen_after: list[list[int]] | None = None


@dataclass
class SamplerOutput:
    next_ids: list[int]
    logprobs: list[float | None]  # logprob of the chosen token (None if not asked)
    top_logprobs: list[list[tuple[float, int]] | None]


class Sampler:
    def __init__(self, apply_token_bitmask) -> None:
        self.apply_token_bitmask = apply_token_bitmask

    def __call__(self, logits: torch.Tensor, inp: SamplingInputs) -> SamplerOutput:
        logits = self._penalize(logits, inp)
        for row, bias in enumerate(inp.logit_biases or ()):
            if bias:
                idx = torch.tensor(list(bias), device=logits.device)
                logits[row, idx] += torch.tensor(list(bias.values()), device=logits.device,
                                                 dtype=logits.dtype)
        for row, banned in enumerate(inp.banned_ids):
            if banned:
                logits[row, banned] = float("-inf")
        if inp.bitmask is not None:
            self.apply_token_bitmask(logits, inp.bitmask)
        want_lp = [n >= 0 for n in inp.top_logprobs_nums]
        logprobs = torch.log_softmax(logits, dim=-1) if any(want_lp) else None

        next_ids = logits.argmax(dim=-1)
        sample_rows = [i for i, g in enumerate(inp.generators) if g is not None]
        if sample_rows:
            next_ids = next_ids.clone()
            for row, token in zip(sample_rows, self._sample(logits, inp, sample_rows)):
                next_ids[row] = token
        ids = next_ids.tolist()
        out_lp: list[float | None] = [None] * len(ids)
        out_top: list[list[tuple[float, int]] | None] = [None] * len(ids)
        if logprobs is not None:
            chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1).tolist()
            max_top = max(inp.top_logprobs_nums)
            top_v, top_i = (logprobs.topk(max_top, dim=-1) if max_top > 0 else (None, None))
            for row, n in enumerate(inp.top_logprobs_nums):
                if n < 0:
                    continue
                out_lp[row] = chosen[row]
                out_top[row] = (list(zip(top_v[row, :n].tolist(), top_i[row, :n].tolist()))
                                if n > 0 else [])
        return SamplerOutput(ids, out_lp, out_top)

    @staticmethod
    def _penalize(logits: torch.Tensor, inp: SamplingInputs) -> torch.Tensor:
        rows_fp = [i for i, (f, p) in enumerate(zip(inp.frequency_penalties,
                                                    inp.presence_penalties)) if f or p]
        if rows_fp:
            counts = torch.zeros(len(rows_fp), logits.shape[1], device=logits.device)
            for j, row in enumerate(rows_fp):
                ids = inp.output_ids[row]
                if ids:
                    idx = torch.tensor(ids, device=logits.device)
                    counts[j].scatter_add_(0, idx, torch.ones(len(ids), device=logits.device))
            freq = torch.tensor([inp.frequency_penalties[r] for r in rows_fp],
                                device=logits.device)[:, None]
            pres = torch.tensor([inp.presence_penalties[r] for r in rows_fp],
                                device=logits.device)[:, None]
            logits[rows_fp] -= freq * counts + pres * (counts > 0).float()
        unique: dict[int, set[int]] = {}  # id(seen list) -> its tokens
        for row, penalty in enumerate(inp.repetition_penalties):
            if penalty != 1.0 and inp.seen_ids is not None and inp.seen_ids[row]:
                seen = inp.seen_ids[row]
                tokens = unique.get(id(seen))
                if tokens is None:
                    tokens = unique[id(seen)] = set(seen)
                if inp.seen_after and inp.seen_after[row]:
                    tokens = tokens | set(inp.seen_after[row])
                idx = torch.tensor(sorted(tokens), device=logits.device)
                vals = logits[row, idx]
                logits[row, idx] = torch.where(vals > 0, vals / penalty, vals * penalty)
        return logits

    @staticmethod
    def _sample(logits: torch.Tensor, inp: SamplingInputs, rows: list[int]) -> list[int]:
        temps = torch.tensor([max(inp.temperatures[r], 1e-6) for r in rows],
                             device=logits.device)[:, None]
        probs = torch.softmax(logits[rows] / temps, dim=-1)  # (S, V)
        if not bool(torch.isfinite(probs).all()):  # e.g. every token masked out
            raise ValueError("sampling distribution is not finite (no token allowed?)")
        # One uniform per row from the request's own generator, then an inverse-CDF draw.
        # (torch.multinomial draws exponential noise over the whole vocabulary from the
        # generator: ~2 ms per row on this CPU, 0.1 s per step at batch 64.)
        u = torch.cat([draw_uniform(inp.generators[r], logits.device) for r in rows])
        out = [0] * len(rows)
        filtered = [inp.top_ks[r] >= 0 or inp.top_ps[r] < 1.0 or inp.min_ps[r] > 0.0
                    for r in rows]
        plain = [j for j, f in enumerate(filtered) if not f]
        if plain:
            for j, token in zip(plain, draw_inverse_cdf(probs[plain], u[plain]).tolist()):
                out[j] = token
        for j in (j for j, f in enumerate(filtered) if f):
            k, p, mp = inp.top_ks[rows[j]], inp.top_ps[rows[j]], inp.min_ps[rows[j]]
            vals, idx = probs[j].topk(min(_CANDIDATES, probs.shape[1]))
            keep = _keep_sorted(vals, k, p, mp)
            if bool(keep[-1]) and len(vals) < probs.shape[1]:  # kept set may extend further
                vals, idx = probs[j].sort(descending=True)
                keep = _keep_sorted(vals, k, p, mp)
            out[j] = int(idx[draw_inverse_cdf((vals * keep)[None], u[j:j + 1])])
        return out


def draw_uniform(generator: torch.Generator, device) -> torch.Tensor:
    """One uniform in [0, 1) from a request's generator: the one draw a sampled token
    takes (``Sampler``; ``ModelRunner.rewind_generator`` replays them)."""
    return torch.rand(1, generator=generator, device=device)


def accept_prefix(draft: list[int], sampled: list[int]) -> int:
    """Speculative verification: how many draft tokens to accept.

    ``sampled[j]`` is the token the sampler drew at the ``j``-th verification row (after
    the request's last token and the first ``j`` draft tokens), exactly as a decode step at
    that point would draw it: the same processed distribution ``p_j`` (penalties counting
    the earlier draft tokens, logit bias, banned tokens, the grammar's mask after them,
    temperature, top-k/p, min-p) and the same uniform, the next one of the request's
    generator. Draft token ``draft[j]`` is accepted while every earlier one was and
    ``sampled[j] == draft[j]``; the request then emits the accepted tokens and
    ``sampled[m]`` (``m`` = the count returned), and its generator is rewound to one draw
    per emitted token.

    This is the standard rejection rule for a deterministic proposal: ``draft[j]`` is
    accepted with probability ``p_j(draft[j])``, and on rejection the emitted token is
    ``sampled[j]`` given that it differs from ``draft[j]``, distributed as ``p_j`` with
    ``draft[j]``'s mass removed and renormalized; so every emitted token has the
    distribution decoding gives it, and with the same seed the same value (the same draw
    of the same distribution). Greedy rows are the case of a point mass at the argmax."""
    m = 0
    while m < len(draft) and sampled[m] == draft[m]:
        m += 1
    return m


_BLOCK = 256


def draw_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of non-negative ``weights [S, V]`` (not all zero), the index whose CDF
    interval holds ``u [S]`` in [0, 1) scaled to the row's total: token ``i`` is drawn
    with probability ``weights[i] / sum``, and a zero-weight index never. Two levels
    (blocks of 256, then within the block) in float64, so the scan stays short and exact
    enough for a 50k vocabulary."""
    s, v = weights.shape
    pad = (-v) % _BLOCK
    w = torch.nn.functional.pad(weights, (0, pad)) if pad else weights
    blocks = w.reshape(s, -1, _BLOCK)
    cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (S, blocks)
    x = torch.minimum(u.double() * cdf[:, -1], cdf[:, -1] * (1 - 1e-12))  # u may round to 1
    blk = torch.searchsorted(cdf, x[:, None], right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)
    before = torch.where(blk > 0, cdf.gather(1, (blk - 1).clamp(min=0)[:, None]).squeeze(1),
                         torch.zeros_like(x))
    inner = blocks[torch.arange(s, device=w.device), blk].double().cumsum(-1)  # (S, BLOCK)
    rem = torch.minimum(x - before, inner[:, -1] * (1 - 1e-12))  # rounding: stay inside
    pos = torch.searchsorted(inner, rem[:, None], right=True).squeeze(1).clamp_(max=_BLOCK - 1)
    return blk * _BLOCK + pos


def _keep_sorted(vals: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Which of the descending-sorted probabilities ``vals`` survive the filters."""
    keep = torch.ones_like(vals, dtype=torch.bool)
    if top_k > 0:
        keep[top_k:] = False
    if top_p < 1.0:
        before = vals.cumsum(0) - vals  # mass strictly before each token
        keep &= before < top_p
    if min_p > 0.0:
        keep &= vals >= min_p * vals[0]
    keep[0] = True
    return keep
