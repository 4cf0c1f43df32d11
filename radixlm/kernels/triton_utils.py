"""Helpers shared by the Triton kernels."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def dot_flags(dtype: torch.dtype) -> dict[str, object]:
    """Constexprs for ``mma``: exact fp32 products for fp32 inputs (no TF32), and fp32
    operands in the interpreter, whose ``tl.dot`` multiplies bf16 bit patterns as integers
    (Triton 3.9). Operands are rounded to their dtype first, so results match the GPU's."""
    return {"DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
            "DOT_UPCAST": interpreting()}


@triton.jit
def mma(a, b, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """``a @ b`` with an fp32 result (see ``dot_flags``)."""
    if DOT_UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT_PRECISION)
