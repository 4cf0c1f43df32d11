"""Block-quantized weight matrices for the native kernels (plain numpy, no torch math).

A ``QWeight`` is a matrix ``[n, k]`` stored in blocks of 32 along ``k``:

- ``Q4``: ``q`` 4-bit unsigned, ``W = d * q + m`` (GGUF Q4_1 as is; Q4_0's ``d * (q - 8)``
  is the same with ``m = -8 d``), nibbles packed 16 bytes a block, low nibble = element j,
  high nibble = element j + 16 (GGUF's own order);
- ``Q8``: ``q`` int8, ``W = d * q`` (GGUF Q8_0).

``d`` and ``m`` are fp16 arrays ``[n, k/32]``, as GGUF stores them (the kernels read 2
bytes per scale: at one token per step the weights stream from DRAM, and fp32 scales
were 24 bytes per Q4 block instead of 20).
Weights from GGUF Q4_0 / Q4_1 / Q8_0 tensors are the file's own numbers; any other source
(fp32/bf16 checkpoints, other GGUF types) is quantized here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK = 32
FMT_Q4, FMT_Q8 = 4, 8


@dataclass
class QWeight:
    fmt: int  # FMT_Q4 | FMT_Q8
    qs: np.ndarray  # uint8 [n, k/32, 16] (Q4) or int8 [n, k/32, 32] (Q8)
    d: np.ndarray  # float16 [n, k/32]
    m: np.ndarray | None  # float16 [n, k/32] (Q4 only)

    @property
    def n(self) -> int:
        return int(self.qs.shape[0])

    @property
    def k(self) -> int:
        return int(self.qs.shape[1]) * BLOCK

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """The matrix ``[n, k]`` these blocks represent, computed in ``dtype`` (float32:
        the file's own numbers; float64: ``d q + m`` before any rounding)."""
        if self.fmt == FMT_Q4:
            q = np.concatenate([self.qs & 0x0F, self.qs >> 4], axis=-1).astype(dtype)
            w = q * self.d[..., None].astype(dtype) + self.m[..., None].astype(dtype)
        else:
            w = self.qs.astype(dtype) * self.d[..., None].astype(dtype)
        return w.reshape(self.n, self.k)

    def rows(self, perm: np.ndarray) -> QWeight:
        """The same blocks with output rows reordered."""
        return QWeight(self.fmt, self.qs[perm], self.d[perm],
                       None if self.m is None else self.m[perm])


def concat(parts: list[QWeight]) -> QWeight:
    """Row-concatenation (fused q/k/v or gate/up); mixed formats become Q8 of the
    dequantized values (exact for Q8 parts, within Q8 rounding for Q4 ones)."""
    if len({p.fmt for p in parts}) > 1:
        parts = [quantize_q8(p.dequantize()) for p in parts]
    first = parts[0]
    return QWeight(first.fmt, np.concatenate([p.qs for p in parts]),
                   np.concatenate([p.d for p in parts]),
                   None if first.m is None else np.concatenate([p.m for p in parts]))


def quantize_q8(w: np.ndarray) -> QWeight:
    """Symmetric int8 blocks of 32 (GGUF Q8_0's rule: ``d = amax / 127``)."""
    n, k = w.shape
    g = np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)
    d16 = (np.abs(g).max(-1) / 127.0).astype(np.float16)
    d = d16.astype(np.float32)  # the stored scale is the one the values are rounded to
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    return QWeight(FMT_Q8, q, d16, None)


def quantize_q4(w: np.ndarray) -> QWeight:
    """Asymmetric 4-bit blocks of 32 (GGUF Q4_1's rule: ``d = (max - min) / 15``)."""
    n, k = w.shape
    g = np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)
    lo, hi = g.min(-1), g.max(-1)
    d16, m16 = ((hi - lo) / 15.0).astype(np.float16), lo.astype(np.float16)
    d, m = d16.astype(np.float32), m16.astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint((g - m[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return QWeight(FMT_Q4, packed, d16, m16)


def _fp16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0]


def from_gguf_raw(type_name: str, raw: np.ndarray) -> QWeight | None:
    """Blocks of a GGUF tensor's raw bytes ``[n, bytes per row]``; None for other types."""
    n = raw.shape[0]
    if type_name == "Q4_1":
        b = raw.reshape(n, -1, 20)
        return QWeight(FMT_Q4, np.ascontiguousarray(b[..., 4:]), _fp16(b[..., 0:2]),
                       _fp16(b[..., 2:4]))
    if type_name == "Q4_0":
        b = raw.reshape(n, -1, 18)
        d = _fp16(b[..., 0:2])
        return QWeight(FMT_Q4, np.ascontiguousarray(b[..., 2:]), d, (-8.0 * d).astype(np.float16))
    if type_name == "Q8_0":
        b = raw.reshape(n, -1, 34)
        return QWeight(FMT_Q8, np.ascontiguousarray(b[..., 2:]).view(np.int8),
                       _fp16(b[..., 0:2]), None)
    return None


def gguf_blocks(path: Path) -> dict[str, QWeight]:
    """GGUF tensor name -> blocks, for the tensors stored as Q4_0 / Q4_1 / Q8_0."""
    import gguf

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        raw = np.asarray(t.data)
        if raw.dtype != np.uint8 or raw.ndim != 2:
            continue
        w = from_gguf_raw(t.tensor_type.name, raw)
        if w is not None:
            out[t.name] = w
    return out
