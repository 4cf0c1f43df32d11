"""Helpers shared by the Triton kernels."""

from __future__ import annotations

import torch


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact fp32 products for fp32 operands (no TF32), so the
    fp32 kernels match their twins closely; irrelevant for bf16 operands."""
    return "ieee" if dtype == torch.float32 else "tf32"
