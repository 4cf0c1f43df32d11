"""Pure-torch twins of every kernel: the ground truth, and the CPU path.

Shapes use T = tokens in the step (flattened over requests), B = requests, H = heads,
Hkv = KV heads, D = head dim, V = vocabulary, S = KV pool capacity.
"""

from __future__ import annotations

import torch


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm in fp32, cast back. With ``residual``: ``h = x + residual`` is normalized and
    ``(normed, h)`` is returned (the fused add-norm of a transformer block)."""
    if residual is not None:
        x = x + residual
        residual = x
    # F.rms_norm is the mean-of-squares/rsqrt math in one call; it accumulates in fp32 for
    # reduced-precision inputs, so it equals the fp32-upcast formula (checked in tests).
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    out = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    return out if residual is None else (out, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x`` is ``[T, 2F]`` = gate ‖ up; returns ``silu(gate) * up`` of shape ``[T, F]``."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's tanh soft-capping of attention scores and logits: ``tanh(x / cap) * cap``."""
    return torch.tanh(x / cap) * cap


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x`` is ``[T, 2F]`` = gate ‖ up; returns ``gelu_tanh(gate) * up`` (Gemma's MLP)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def rotary_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape ``[T, D/2]`` for the given positions (fp32 math)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (rotate-half) rotary on ``q [T, H, D]`` and ``k [T, Hkv, D]``."""

    heads = q.shape[1]
    x = torch.cat([q, k], dim=1)  # one pass over q and k: half the ops at small T
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return out[:, :heads], out[:, heads:]


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Scatter ``k, v [T, Hkv, D]`` into pool slots ``loc [T]`` of ``[S, Hkv, D]`` caches."""
    k_cache[loc] = k.to(k_cache.dtype)
    v_cache[loc] = v.to(v_cache.dtype)


# ---------------------------------------------------------------------- int8 K/V
# An int8 pool keeps, per (token, KV head) row of K and of V, ``D`` int8 values and one
# bf16 scale (symmetric absmax): ``x ~= q * scale``. Every store (this twin, the Triton
# kernel, the native C library) computes the same bytes by the same fp32 operations.
KV_INT8_MAX = 127.0


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (int8 ``q [..., D]``, bf16 ``scale [...]``): ``scale =
    bf16(max|x| / 127)`` (round to nearest even), ``q = clamp(rne(x * (1 / scale)), -127,
    127)`` with the rounded scale (0 where the scale is 0), all in fp32."""
    xf = x.float()
    scale = (xf.abs().amax(-1) / KV_INT8_MAX).to(torch.bfloat16)
    s = scale.float()
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    q = torch.round(xf * inv[..., None]).clamp_(-KV_INT8_MAX, KV_INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q [..., D] * scale [...]`` in fp32 (exact: a 7-bit integer times an 8-bit mantissa),
    cast to ``dtype``."""
    return (q.float() * scale.float()[..., None]).to(dtype)


def store_kv_int8(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Quantize ``k, v [T, Hkv, D]`` (``quantize_kv``) into slots ``loc [T]`` of the int8
    caches ``[S, Hkv, D]`` and their bf16 scales ``[S, Hkv]``."""
    for cache, scales, x in ((k_cache, k_scale, k), (v_cache, v_scale, v)):
        q, s = quantize_kv(x)
        cache[loc], scales[loc] = q, s


def _kv_rows(cache: torch.Tensor, scales: torch.Tensor | None,
             slots: torch.Tensor) -> torch.Tensor:
    """Rows ``slots`` of a cache as fp32 (dequantized where ``scales`` is given)."""
    if scales is None:
        return cache[slots].float()
    return dequantize_kv(cache[slots], scales[slots])


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed logits to -inf in place. ``bitmask [B, ceil(V/32)]`` int32: bit
    ``j % 32`` of word ``j // 32`` set means token ``j`` is allowed. Logits wider than
    ``32 * words`` are disallowed past the mask; narrower ones ignore the extra bits."""
    vocab = logits.shape[-1]
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)  # [B, 32 * words]
    if allowed.shape[1] < vocab:
        pad = allowed.new_zeros(allowed.shape[0], vocab - allowed.shape[1])
        allowed = torch.cat([allowed, pad], dim=1)
    logits.masked_fill_(~allowed[:, :vocab], float("-inf"))
    return logits


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
) -> torch.Tensor:
    """One new token per request. ``q [B, H, D]``; request ``b`` attends to slots
    ``req_to_token[req_pool_indices[b], :seq_lens[b]]``. Returns ``[B, H, D]`` (GQA:
    query head ``h`` reads KV head ``h // (H // Hkv)``). ``k_scale, v_scale [S, Hkv]``:
    the caches are int8 (``quantize_kv``) and are read dequantized."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for b in range(q.shape[0]):
        slots = req_to_token[req_pool_indices[b], : int(seq_lens[b])].long()
        k = _kv_rows(k_cache, k_scale, slots).repeat_interleave(group, dim=1)  # [L, H, D]
        v = _kv_rows(v_cache, v_scale, slots).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale
        out[b] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged extend. ``q [T, H, D]`` holds each request's new tokens back to back (request
    ``b`` owns ``extend_lens[b]`` rows). New token ``i`` of request ``b`` sits at position
    ``prefix_lens[b] + i`` and attends to positions ``0 .. prefix_lens[b] + i`` read
    through ``req_to_token`` (its own new K/V must already be stored). Returns ``[T, H, D]``.
    ``k_scale, v_scale``: int8 caches, as in ``decode_attention``."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    start = 0
    for b in range(len(extend_lens)):
        n, p = int(extend_lens[b]), int(prefix_lens[b])
        slots = req_to_token[req_pool_indices[b], : p + n].long()
        k = _kv_rows(k_cache, k_scale, slots).repeat_interleave(group, dim=1)  # [p+n, H, D]
        v = _kv_rows(v_cache, v_scale, slots).repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,lhd->htl", q[start : start + n].float(), k) * scale
        causal = torch.arange(p + n)[None, :] <= (p + torch.arange(n))[:, None]
        scores.masked_fill_(~causal.to(scores.device), float("-inf"))
        out[start : start + n] = torch.einsum("htl,lhd->thd", scores.softmax(-1), v).to(q.dtype)
        start += n
    return out
