"""CPU variants of two twins, for steps of few tokens (decode), where eager PyTorch pays per
op rather than per element.

A one-token decode step of a 30-layer model runs ~1500 small ops; RMSNorm and rotary are a
third of them. Same contracts and results as ``radixlm.kernels.ref`` (up to rounding, checked
in tests); above ``SMALL_TOKENS`` rows they defer to the twins, which are cheaper there.

- ``rmsnorm``: ``F.rms_norm`` on bf16 is a chain of ~8 ATen ops, while ``F.layer_norm`` is
  one fused kernel (3x faster at one row). LayerNorm of ``[h, -h]`` has mean 0 and variance
  ``mean(h**2)``, so its first half is exactly RMSNorm of ``h``.
- ``apply_rotary``: rotate-half is ``x @ M`` with ``M = [[C, S], [-S, C]]`` (C, S diagonal),
  one batched matmul per layer instead of ~10 elementwise ops. ``M`` depends only on the
  positions, so ``rotary_cos_sin`` builds it once per step for all layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels import ref

SMALL_TOKENS = 64


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None):
    """``ref.rmsnorm``'s contract; one LayerNorm over ``[h, -h]`` for small steps."""
    if x.shape[0] > SMALL_TOKENS or x.dim() != 2:
        return ref.rmsnorm(x, weight, eps, residual)
    h = x if residual is None else x + residual
    if weight.dtype != h.dtype:
        weight = weight.to(h.dtype)
    d = h.shape[-1]
    both = torch.cat([h, h.neg()], dim=-1)
    out = F.layer_norm(both, (2 * d,), torch.cat([weight, weight]), None, eps)[:, :d]
    return out if residual is None else (out, h)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                   scaling: float = 1.0) -> tuple:
    """``(cos, sin, M)``: the twin's tables, plus the rotation matrices ``M [T, D, D]`` when
    the step is small (else None)."""
    cos, sin = ref.rotary_cos_sin(positions, inv_freq, dtype, scaling)
    if positions.shape[0] > SMALL_TOKENS:
        return cos, sin, None
    c, s = torch.diag_embed(cos), torch.diag_embed(sin)  # (T, D/2, D/2)
    m = torch.cat([torch.cat([c, s], dim=-1), torch.cat([-s, c], dim=-1)], dim=-2)
    return cos, sin, m


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 m: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``ref.apply_rotary``'s contract; with ``M``, one matmul over q and k together."""
    if m is None:
        return ref.apply_rotary(q, k, cos, sin)
    heads = q.shape[1]
    out = torch.matmul(torch.cat([q, k], dim=1), m)  # (T, H + Hkv, D)
    return out[:, :heads], out[:, heads:]
