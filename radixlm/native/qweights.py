"""Weight matrices for the native kernels (plain numpy, no torch math).

A ``QWeight`` is a matrix ``[n, k]``, stored in blocks of 32 along ``k``:

- ``Q4``: ``q`` 4-bit unsigned, ``W = d * q + m`` (GGUF Q4_1 as is; Q4_0's ``d * (q - 8)``
  is the same with ``m = -8 d``), nibbles packed 16 bytes a block, low nibble = element j,
  high nibble = element j + 16 (GGUF's own order);
- ``Q8``: ``q`` int8, ``W = d * q`` (GGUF Q8_0);

or as GGUF K-quant super-blocks of 256 as the file has them (``Q4_K``, ``Q5_K``,
``Q6_K``: ``qs`` the raw rows ``[n, k/256 * bytes]``, their scales inside, ``d = m =
None``; the layouts are in csrc/kquants.c), or as dense rows at the checkpoint's own
precision (``BF16``: the bf16 bits as uint16, ``F32``), which the kernels read as they are.

``d`` and ``m`` are fp16 arrays ``[n, k/32]``, as GGUF stores them (the kernels read 2
bytes per scale: at one token per step the weights stream from DRAM, and fp32 scales
were 24 bytes per Q4 block instead of 20).
Weights from GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K tensors are the file's own
numbers; other quantized GGUF types are rewritten into one of these formats where a caller
asks (``gguf_blocks``, ``recode.py``: exactly for Q3_K, Q5_0 and IQ4_NL); checkpoints are quantized
here only on request (``quantize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radixlm.native import recode

BLOCK = 32
FMT_Q4, FMT_Q8, FMT_BF16, FMT_F32 = 4, 8, 16, 32  # csrc/rlm.h
FMT_IQ4 = 5  # csrc/rlm.h: IQ4 grid values at Q4's nibbles under Q8's scales (kx32 rows only)
FMT_Q5 = 6  # csrc/rlm.h: Q5_0's nibbles and fifth bits under its scales (kx32 rows only)
FMT_Q4_K, FMT_Q5_K, FMT_Q6_K = 12, 13, 14  # csrc/rlm.h: GGUF super-blocks as in the file
FMT_Q3_K = 11  # csrc/rlm.h: a Q3_K rewrite's Q6_K numbers in kx3.c's rows only (Arena)
KQUANT_FMTS = (FMT_Q4_K, FMT_Q5_K, FMT_Q6_K)
SUPER = 256  # weights per K-quant super-block
# K-quant format -> (GGUF type name, bytes per super-block)
KQUANTS = {FMT_Q4_K: ("Q4_K", 144), FMT_Q5_K: ("Q5_K", 176), FMT_Q6_K: ("Q6_K", 210)}


@dataclass
class QWeight:
    fmt: int  # FMT_Q4 | FMT_Q8 | FMT_Q4_K | FMT_Q5_K | FMT_Q6_K | FMT_BF16 | FMT_F32
    qs: np.ndarray  # uint8 [n, k/32, 16] (Q4), int8 [n, k/32, 32] (Q8), uint8 [n, k/256 *
    # bytes] (K-quants: the raw rows); dense: the rows [n, k], uint16 (bf16 bits) or float32
    d: np.ndarray | None  # float16 [n, k/32] (blocks)
    m: np.ndarray | None  # float16 [n, k/32] (Q4 only)
    kind: str = ""  # q4_0 | q4_1 | q8_0 | bf16 | fp32: what the numbers are
    origin: str | None = None  # the GGUF tensor type they were read from (None: made here)
    # a ``recode.PENDING`` type: ``qs`` still holds the file's rows ``[n, bytes]`` of it,
    # rewritten into ``fmt``'s (Q6_K for Q3_K, Q8 for Q5_0 / IQ4_NL / IQ4_XS) by ``materialized``
    # where the weight is placed (one tensor's rewrite alive at a time)
    pending: str | None = None

    @property
    def dense(self) -> bool:
        return self.fmt in (FMT_BF16, FMT_F32)

    @property
    def n(self) -> int:
        return int(self.qs.shape[0])

    @property
    def k(self) -> int:
        if self.pending:
            size, weights = recode.PENDING[self.pending]
            return int(self.qs.shape[1]) // size * weights
        if self.fmt in KQUANTS:
            return int(self.qs.shape[1]) // KQUANTS[self.fmt][1] * SUPER
        return int(self.qs.shape[1]) * (1 if self.dense else BLOCK)

    def materialized(self, threads: int = 1) -> QWeight:
        """This weight in ``fmt``'s own layout: a ``pending`` rewrite done on ``threads`` (a
        new QWeight; the file's rows untouched), else itself."""
        if not self.pending:
            return self
        if self.pending == "Q3_K":
            return QWeight(self.fmt, recode.q3_k_as_q6_k(self.qs, threads), None, None,
                           self.kind, self.origin)
        if self.pending == "Q5_0":
            q, d = recode.q5_0_as_q8_0(self.qs, threads)
        else:
            q, d = recode.iq4_as_q8_0(self.pending, self.qs, threads)
        return QWeight(self.fmt, q, d, None, self.kind, self.origin)

    def as_iq4(self, threads: int = 1) -> QWeight:
        """A pending IQ4_NL / IQ4_XS rewrite as ``FMT_IQ4`` blocks (``recode.iq4_nibbles`` on
        ``threads``: the file's nibbles, the Q8 rewrite's scales), which only the arena's
        kx32 rows take (``arena.Arena``)."""
        qs, d = recode.iq4_nibbles(self.pending, self.qs, threads)
        return QWeight(FMT_IQ4, qs, d, None, self.pending.lower(), self.origin)

    def as_q5(self) -> QWeight:
        """A pending Q5_0 rewrite as ``FMT_Q5`` blocks: views of the file's rows (quants
        ``[n, k/32, 16]``, fp16 scales and the fifth bits' uint32 ``[n, k/32]`` in ``m``),
        which only the arena's kx32 rows take (``arena.Arena``)."""
        b = recode.check_rows(self.qs, recode.Q5_0_BYTES, "Q5_0").reshape(self.n, -1, 22)
        d = b[:, :, 0:2].view(np.float16)[..., 0]
        qh = b[:, :, 2:6].view(np.uint32)[..., 0]
        return QWeight(FMT_Q5, b[:, :, 6:], d, qh, "q5_0", self.origin)

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """The matrix ``[n, k]`` these blocks represent, computed in ``dtype`` (float32:
        the file's own numbers; float64: ``d q + m`` before any rounding)."""
        if self.pending and self.fmt not in KQUANTS:
            return self.materialized().dequantize(dtype)
        if self.fmt == FMT_F32:
            return self.qs.astype(dtype)
        if self.fmt == FMT_BF16:
            return (self.qs.astype(np.uint32) << 16).view(np.float32).astype(dtype)
        if self.fmt in KQUANTS:  # gguf-py's float32 numbers (the format's own rule)
            import gguf

            kind = gguf.GGMLQuantizationType[self.pending or KQUANTS[self.fmt][0]]
            return gguf.quants.dequantize(self.qs, kind).reshape(self.n, self.k).astype(dtype)
        if self.fmt == FMT_Q4:
            q = np.concatenate([self.qs & 0x0F, self.qs >> 4], axis=-1).astype(dtype)
            w = q * self.d[..., None].astype(dtype) + self.m[..., None].astype(dtype)
        else:
            w = self.qs.astype(dtype) * self.d[..., None].astype(dtype)
        return w.reshape(self.n, self.k)

    def rows(self, perm: np.ndarray) -> QWeight:
        """The same weights with output rows reordered."""
        return QWeight(self.fmt, self.qs[perm], None if self.d is None else self.d[perm],
                       None if self.m is None else self.m[perm], self.kind, self.origin,
                       self.pending)


def is_kquant(w: QWeight) -> bool:
    """Whether ``w`` holds GGUF K-quant super-blocks (Q4_K / Q5_K / Q6_K)."""
    return w.fmt in KQUANT_FMTS


def dense_rows(w: np.ndarray) -> QWeight:
    """``w [n, k]`` as dense rows: float32 as is, uint16 as bf16 bits."""
    w = np.ascontiguousarray(w)
    if w.dtype == np.uint16:
        return QWeight(FMT_BF16, w, None, None, "bf16")
    return QWeight(FMT_F32, np.asarray(w, dtype=np.float32), None, None, "fp32")


def concat(parts: list[QWeight]) -> QWeight:
    """Row-concatenation (fused q/k/v or gate/up); mixed formats become Q8 of the
    dequantized values (exact for Q8 parts, within Q8 rounding for the others)."""
    parts = [p.materialized() for p in parts]
    if len({(p.fmt, p.kind) for p in parts}) > 1:
        parts = [quantize_q8(p.dequantize()) for p in parts]
    first = parts[0]
    origins = sorted({p.origin for p in parts if p.origin})
    return QWeight(first.fmt, np.concatenate([p.qs for p in parts]),
                   None if first.d is None else np.concatenate([p.d for p in parts]),
                   None if first.m is None else np.concatenate([p.m for p in parts]),
                   first.kind, "+".join(origins) or None)


def quantize_q8(w: np.ndarray) -> QWeight:
    """Symmetric int8 blocks of 32 (GGUF Q8_0's rule: ``d = amax / 127``)."""
    n, k = w.shape
    g = np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)
    d16 = (np.abs(g).max(-1) / 127.0).astype(np.float16)
    d = d16.astype(np.float32)  # the stored scale is the one the values are rounded to
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    return QWeight(FMT_Q8, q, d16, None, "q8_0")


def _pack_q4(q: np.ndarray) -> np.ndarray:
    return q[..., :16] | (q[..., 16:] << 4)


def quantize_q4(w: np.ndarray) -> QWeight:
    """Asymmetric 4-bit blocks of 32 (GGUF Q4_1's rule: ``d = (max - min) / 15``)."""
    n, k = w.shape
    g = np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)
    lo, hi = g.min(-1), g.max(-1)
    d16, m16 = ((hi - lo) / 15.0).astype(np.float16), lo.astype(np.float16)
    d, m = d16.astype(np.float32), m16.astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint((g - m[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    return QWeight(FMT_Q4, _pack_q4(q), d16, m16, "q4_1")


def quantize_q4_0(w: np.ndarray) -> QWeight:
    """Symmetric 4-bit blocks of 32 (GGUF Q4_0's rule: ``d = v / -8`` for the value ``v``
    of largest magnitude, ``q = min(15, floor(x / d + 8.5))``, ``W = d (q - 8)``), stored as
    Q4 blocks with ``m = -8 d``."""
    n, k = w.shape
    g = np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)
    idx = np.abs(g).argmax(-1)[..., None]
    d16 = (np.take_along_axis(g, idx, -1)[..., 0] / -8.0).astype(np.float16)
    d = d16.astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.floor(g * inv[..., None] + 8.5), 0, 15).astype(np.uint8)
    return QWeight(FMT_Q4, _pack_q4(q), d16, (-8.0 * d16).astype(np.float16), "q4_0")


# What ``--quantization`` names (SGLang's flag; llama.cpp's type names) -> the quantizer.
QUANTIZERS = {"q8_0": quantize_q8, "q4_0": quantize_q4_0, "q4_1": quantize_q4}


def quantize(w: np.ndarray, kind: str) -> QWeight:
    """``w [n, k]`` in blocks of ``kind`` (a key of QUANTIZERS)."""
    return QUANTIZERS[kind](w)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """2 bytes per block ``[..., 2]`` (a strided view of the file's blocks) as fp16 ``[...]``,
    still a view: reading a tensor's scales here would fault in every page of the file."""
    return raw.view(np.float16)[..., 0]


def from_gguf_raw(type_name: str, raw: np.ndarray) -> QWeight | None:
    """Blocks of a GGUF tensor's raw bytes ``[n, bytes per row]``; None for other types. The
    quants and scales stay strided views of ``raw``, copied once where the native arena lays
    them out (Q4_0's minimums ``-8 d`` are computed here)."""
    n = raw.shape[0]
    if type_name == "Q4_1":
        b = raw.reshape(n, -1, 20)
        return QWeight(FMT_Q4, b[..., 4:], _fp16(b[..., 0:2]), _fp16(b[..., 2:4]), "q4_1",
                       type_name)
    if type_name == "Q4_0":
        b = raw.reshape(n, -1, 18)
        d = _fp16(b[..., 0:2])
        return QWeight(FMT_Q4, b[..., 2:], d, (-8.0 * d).astype(np.float16), "q4_0",
                       type_name)
    if type_name == "Q8_0":
        b = raw.reshape(n, -1, 34)
        return QWeight(FMT_Q8, b[..., 2:].view(np.int8), _fp16(b[..., 0:2]), None, "q8_0",
                       type_name)
    for fmt, (name, size) in KQUANTS.items():
        if type_name == name:
            if raw.shape[1] % size:
                raise ValueError(f"{name} rows of {raw.shape[1]} bytes are not whole "
                                 f"super-blocks of {size}")
            return QWeight(fmt, raw, None, None, name.lower(), type_name)
    return None


def recoded(type_name: str, raw: np.ndarray) -> QWeight:
    """A GGUF tensor of a type the library has no kernel for (``recode.EXACT``,
    ``recode.ROUNDED`` or ``recode.REQUANTIZED``; raw bytes ``[n, bytes per row]``) as blocks
    of a native format (recode.py's rules; ``recode.PENDING`` types' rewrites ``pending``
    until placed); ``origin`` is ``type_name``. A ValueError for any other type."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if type_name == "Q3_K":  # (rewritten where it is placed: ``materialized``)
        recode.check_rows(raw, recode.Q3_K_BYTES, "Q3_K")
        return QWeight(FMT_Q6_K, raw, None, None, "q6_k", type_name, pending=type_name)
    if type_name in ("Q5_0", "IQ4_NL", "IQ4_XS"):  # (rewritten where placed: ``materialized``)
        recode.check_rows(raw, recode.PENDING[type_name][0], type_name)
        return QWeight(FMT_Q8, raw, None, None, "q8_0", type_name, pending=type_name)
    if type_name not in recode.REQUANTIZED:
        raise ValueError(f"no native format holds GGUF type {type_name}")
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    dense = np.asarray(gguf.quants.dequantize(raw, kind), dtype=np.float32)
    w = quantize_q8(dense.reshape(raw.shape[0], -1))
    w.origin = type_name
    return w


DENSE_GGUF_TYPES = ("F32", "F16", "BF16", "F64")


def gguf_blocks(path: Path) -> dict[str, QWeight]:
    """GGUF tensor name -> blocks, for every quantized 2-D tensor: Q4_0 / Q4_1 / Q8_0 /
    Q4_K / Q5_K / Q6_K as the file has them, other quantized types ``recoded`` (``origin``
    names the file's type). Dense tensors (F32, F16, BF16) are left out: they run as dense
    rows."""
    from radixlm.native.gguf_file import read_gguf

    out = {}
    for t in read_gguf(path)[1]:
        raw = np.asarray(t.data)
        name = t.tensor_type.name
        if raw.dtype != np.uint8 or raw.ndim != 2 or name in DENSE_GGUF_TYPES:
            continue
        out[t.name] = from_gguf_raw(name, raw) or recoded(name, raw)
    return out
