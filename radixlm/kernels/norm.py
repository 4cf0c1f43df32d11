"""Fused RMSNorm (optionally with the residual add of a transformer block) in Triton.

Twin: ``radixlm.kernels.ref.rmsnorm``. One program normalizes one row; the hidden size
fits in one block (up to 64K elements), so each row is read once and written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, h_ptr,
    x_stride, res_stride, out_stride, h_stride,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        # Round the sum to the input dtype first, exactly like ``x + residual`` in torch.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(h_ptr + row * h_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (xf * rstd * w).to(x.dtype), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t if t.stride(-1) == 1 else t.contiguous()
    return t.reshape(-1, t.shape[-1])


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim (fp32 math, output in ``x.dtype``). With ``residual``:
    returns ``(rmsnorm(x + residual), x + residual)``. Inputs are not modified."""
    n_cols = x.shape[-1]
    block = triton.next_power_of_2(n_cols)
    if block > 65536:
        raise ValueError(f"rmsnorm: hidden size {n_cols} exceeds one block")
    x2 = _rows(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, n_cols)
    if residual is not None:
        res2 = _rows(residual)
        h = torch.empty_like(out)
        h2 = h.view(-1, n_cols)
    else:
        res2, h2 = x2, out2  # unused by the kernel
    if x2.shape[0] == 0:
        return out if residual is None else (out, h)
    num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    _rmsnorm_kernel[(x2.shape[0],)](
        x2, res2, weight, out2, h2,
        x2.stride(0), res2.stride(0), out2.stride(0), h2.stride(0),
        n_cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=num_warps,
    )
    return out if residual is None else (out, h)
