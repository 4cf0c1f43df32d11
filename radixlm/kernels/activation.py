"""SiLU-and-mul (the gated MLP activation) in Triton. Twin: ``ref.silu_and_mul``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x`` is ``[..., 2F]`` = gate ‖ up; returns ``silu(gate) * up`` of shape ``[..., F]``
    (fp32 math, one rounding to ``x.dtype``)."""
    n_cols = x.shape[-1] // 2
    x2 = (x if x.stride(-1) == 1 else x.contiguous()).reshape(-1, 2 * n_cols)
    out = torch.empty((*x.shape[:-1], n_cols), dtype=x.dtype, device=x.device)
    out2 = out.view(-1, n_cols)
    if x2.shape[0] == 0 or n_cols == 0:
        return out
    block = min(1024, triton.next_power_of_2(n_cols))
    grid = (x2.shape[0], triton.cdiv(n_cols, block))
    _silu_and_mul_kernel[grid](x2, out2, x2.stride(0), out2.stride(0), n_cols, BLOCK=block)
    return out
