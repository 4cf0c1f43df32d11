"""Pure-torch twins of the native ops: the ground truth their tests compare against."""

from __future__ import annotations

import numpy as np
import torch

from radixlm.native.qweights import KQUANTS, QWeight


def quantize_act(x: torch.Tensor, block: int = 32
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [T, k]`` fp32 -> (int8 ``a [T, k]``, ``d [T, k/block]``, ``s = d * sum(a)``), the
    rule of the C ``quantize_row`` (blocks of 32, Q4 / Q8 weights) and ``quantize_row_k``
    (blocks of 256, K-quants): ``d = amax / 127``, ``a = round-half-even(x / d)``."""
    t, k = x.shape
    g = x.float().view(t, k // block, block)
    d = g.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    a = torch.round(g * inv[..., None]).clamp(-127, 127)
    return a.to(torch.int8).view(t, k), d, d * a.sum(-1)


def qmatmul(x: torch.Tensor, w: QWeight, act: str = "fp32") -> torch.Tensor:
    """``x [T, k] @ W.T`` with ``W`` the dequantized blocks. ``act="int8"``: the input is
    first rounded as the kernel rounds it; ``"bf16"``: input and dequantized weights are
    rounded to bf16 (nearest even), products summed in high precision."""
    weight = torch.from_numpy(w.dequantize()).double()
    if act == "bf16":  # the kernel rounds d q + m once (an FMA) to fp32, then to bf16
        exact = w.dequantize(np.float64) if w.m is not None else w.dequantize()
        weight = torch.from_numpy(exact).float().bfloat16().double()
        x = x.float().bfloat16()
    elif act == "int8":
        block = 256 if w.fmt in KQUANTS else 32
        a, d, _ = quantize_act(x, block)
        x = (a.view(x.shape[0], -1, block).double() * d[..., None].double()).view(x.shape)
    return (x.double() @ weight.T).float()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def attention(q: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor,
              req_to_token: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              scale: float, softcap: float = 0.0) -> torch.Tensor:
    """``q [T, H, D]``; token ``t`` attends to pool slots ``req_to_token[rows[t], :pos[t]+1]``
    of ``k_cache/v_cache [S, Hkv, D]`` (GQA: query head h reads KV head h // (H / Hkv));
    scores soft-capped ``softcap tanh(s / softcap)`` where ``softcap`` is set."""
    t_count, heads, _ = q.shape
    group = heads // k_cache.shape[1]
    out = torch.empty_like(q, dtype=torch.float32)
    for t in range(t_count):
        slots = req_to_token[rows[t], :int(pos[t]) + 1].long()
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)  # (L, H, D)
        values = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[t].float(), keys) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        out[t] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values)
    return out
