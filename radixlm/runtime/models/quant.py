"""Weight-only int4 linears for the CPU decode path.

torch's ``_weight_int4pack_mm_for_cpu`` computes ``x @ W.T`` with ``W = (q - 8) * scale +
zero`` per group of 32 input columns. A GGUF Q4_1 block stores ``W = d * q + m`` over 32
columns, so ``scale = d`` and ``zero = m + 8 d`` represent the source weights exactly
(up to bf16 rounding of the two per-block constants): for a Q4_1 model this path loses
nothing against the file it came from. Other sources are quantized (asymmetric, group 32).

At batch 1 the int4 kernel reads a quarter of the bytes of bf16 and is ~3x faster; past a
few rows it is slower than bf16 GEMM, so ``Linear`` keeps both and picks by row count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from radixlm.runtime.models.invariant import fixed_rows_linear

GROUP = 32
# Rows (tokens) up to which the weight-only kernels beat bf16 GEMM on this class of CPU,
# measured with the 30 layers' weights cold in cache as in a real step (int4: 8.7 ms at 4
# rows, 14.4 ms at 8, 21 ms at 12 vs bf16's ~17.5 ms flat; int8 falls behind sooner).
INT4_MAX_ROWS = 8
INT8_MAX_ROWS = 4
# GEMM row counts above this are rounded up (see ``gemm_rows``); up to it there are only
# this many shapes anyway.
EXACT_ROWS = 64


def gemm_rows(m: int) -> int:
    """The row count a GEMM of ``m`` rows runs at: ``m`` up to ``EXACT_ROWS``, above it
    ``m`` rounded up to at most 8 steps per power of two (steps of >= 64 rows).

    torch's oneDNN path keeps ~1 MB of native memory for every new (rows, weight) shape it
    meets, for the life of the process, and prefill chunks come in every token count: a
    server's RSS grew without bound. Rounded, a process meets at most ~8 row counts per
    power of two (47 up to 16,384 rows) and pads by at most 1/8 (a full step under 512).
    """
    if m <= EXACT_ROWS:
        return m
    step = max(EXACT_ROWS, 1 << (m.bit_length() - 4))
    return -(-m // step) * step


def int4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
    """``q [N, K]`` ints in 0..15, ``scale``/``zero`` ``[N, K/32]`` -> kernel operands."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(),
                                                                 1)
    sz = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
    return packed, sz


def quantize_int4(w: torch.Tensor):
    """Asymmetric group-32 quantization of ``w [N, K]`` (for non-GGUF sources)."""
    n, k = w.shape
    g = w.float().view(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).view(n, k)
    return pack_int4(q, scale, lo + 8 * scale)


def q4_1_from_gguf(gguf_path: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Raw Q4_1 tensors of a GGUF file: name -> (q uint8 [N, K], d [N, K/32], m [N, K/32])."""
    import gguf

    from radixlm.native.gguf_file import read_gguf

    out = {}
    for t in read_gguf(gguf_path)[1]:
        if t.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            continue
        raw = np.asarray(t.data, dtype=np.uint8)  # [N, blocks * 20]
        n = raw.shape[0]
        blocks = raw.reshape(n, -1, 20)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)  # j, then j + 16
        out[t.name] = (q, d, m)
    return out


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 (for the LM head, whose GGUF source is Q8_0)."""
    scales = (w.float().abs().amax(1) / 127).clamp(min=1e-8)
    q = (w.float() / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scales.to(torch.bfloat16)


class Linear:
    """``y = x @ W.T (+ b)``: bf16/fp32 GEMM, or a weight-only kernel (int4 groups or int8
    channels) for few rows. ``fixed_rows`` (the batch-invariant torch path): every call in
    chunks of one shape (``invariant.fixed_rows_linear``), the weight-only kernels unused."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 int4=None, int8=None) -> None:
        self.weight, self.bias, self.int4, self.int8 = weight, bias, int4, int8
        # oneDNN's per-shape memory is a CPU matter: elsewhere GEMMs run at their own rows
        self.round_rows = weight.device.type == "cpu"
        # Rows up to which the weight-only kernel is used (-1: never, even for 0 rows).
        self.max_rows = (INT4_MAX_ROWS if int4 is not None
                         else INT8_MAX_ROWS if int8 is not None else -1)
        self.fixed_rows = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed_rows:
            return fixed_rows_linear(x, self.weight, self.bias)
        if x.shape[0] <= self.max_rows:
            xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
            if self.int4 is not None:
                packed, sz = self.int4
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, GROUP, sz)
            else:
                y = torch.ops.aten._weight_int8pack_mm(xb, *self.int8)
            if y.dtype != x.dtype:
                y = y.to(x.dtype)
            return y if self.bias is None else y + self.bias
        m = x.shape[0]
        pad = gemm_rows(m) - m if self.round_rows else 0
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        y = F.linear(x, self.weight, self.bias)
        return y[:m] if pad else y
