"""GGUF quantized types the native library has no kernel for, rewritten into one it has.

Where a kernel's format holds the type's numbers exactly, the rewrite is lossless and the
kernels compute what the file says (same integers, same scales, same float products as
llama.cpp's and gguf-py's dequantization):

- ``Q3_K`` -> ``Q6_K``: a Q3_K weight is ``(d * (s - 32)) * q`` with ``q`` in [-4, 3] and a
  6-bit scale ``s`` a sub-block of 16; Q6_K is ``(d * sc) * q`` with ``q`` in [-32, 31] and an
  int8 ``sc`` a sub-block of 16, the same fp16 ``d`` a super-block of 256 (210 bytes a
  super-block against the file's 110: 1.9x the bytes, Q8_0's 2.5x);
- ``Q5_0`` -> ``Q8_0``: ``d * (q - 16)`` with ``q`` 5-bit a block of 32 is ``d * q8`` with
  ``q8 = q - 16`` (34 bytes a block against 22).

- ``IQ4_NL`` -> ``Q8_0``: ``d * kv[q]`` with ``q`` a nibble indexing ggml's non-linear grid
  ``kvalues_iq4nl`` (int8 values) a block of 32 is ``d * q8`` with ``q8 = kv[q]`` (34 bytes a
  block against 18).

``IQ4_XS`` runs as Q8_0 blocks of the file's values with each block's scale rounded:
``(d * (ls - 32)) * kv[q]`` (a 6-bit ``ls`` a block of 32, fp16 ``d`` a super-block of 256)
is ``d8 * q8`` with ``q8 = kv[q]`` exactly and ``d8`` the fp16 nearest ``d * (ls - 32)``
(llama.cpp multiplies in fp32): each weight within 2^-11 of the file's, relatively, where
that scale is a normal fp16 (from 2^-14), within 2^-25 x |q8| below (its own 4-bit grid's
steps are ~10%). 34 bytes a block against 17.

The others (``Q2_K``, ``Q5_1``: a minimum per block that no kernel format carries) are
re-quantized: Q8_0 blocks of their dequantized values, close to the file's numbers but not
equal to them. ``qweights.recoded`` applies these rules (``QWeight.origin`` names the file's
type); Q3_K, Q5_0, IQ4_NL and IQ4_XS rows stay the file's until placed (``PENDING``).
"""

from __future__ import annotations

import numpy as np

EXACT = {"Q3_K": "Q6_K", "Q5_0": "Q8_0", "IQ4_NL": "Q8_0"}  # file type -> the kernel
# format holding it exactly
ROUNDED = {"IQ4_XS": "Q8_0"}  # the file's values, each block's scale rounded to fp16
REQUANTIZED = ("Q2_K", "Q5_1")  # run as Q8_0 blocks of their values (not exact)
Q3_K_BYTES, Q5_0_BYTES = 110, 22
# rewritten where placed (``QWeight.pending``): file type -> (bytes, weights) a block
PENDING = {"Q3_K": (Q3_K_BYTES, 256), "IQ4_NL": (18, 32), "IQ4_XS": (136, 256),
           "Q5_0": (22, 32)}
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                     113], np.int8)  # ggml's kvalues_iq4nl (csrc/recode.c's IQ4_GRID)
_IQ4_QS = {"IQ4_NL": (2, 1), "IQ4_XS": (8, 8)}  # where a block's nibbles start, groups of 16


def check_rows(raw: np.ndarray, size: int, name: str) -> np.ndarray:
    """``raw`` as blocks ``[n * blocks a row, size]``; a ValueError where its rows are not
    whole blocks of ``size`` bytes."""
    if raw.ndim != 2 or raw.shape[1] % size:
        raise ValueError(f"{name} rows of {raw.shape[-1]} bytes are not whole blocks of {size}")
    return raw.reshape(-1, size)


def q3_k_as_q6_k(raw: np.ndarray, threads: int = 1) -> np.ndarray:
    """Q3_K rows ``[n, nb * 110]`` as Q6_K rows ``[n, nb * 210]`` of the same numbers: the
    native library's ``rlm_q3k_as_q6k`` (csrc/recode.c, on its pool of ``threads``) where it
    is built, else ``q3_k_as_q6_k_numpy``."""
    from radixlm.native import build

    b = check_rows(raw, Q3_K_BYTES, "Q3_K")
    if (lib := build.load()) is None:
        return q3_k_as_q6_k_numpy(raw)
    out = np.empty((b.shape[0], 210), np.uint8)
    lib.rlm_q3k_as_q6k(b.ctypes.data, b.shape[0], out.ctypes.data, threads)
    return out.reshape(raw.shape[0], -1)


def q3_k_as_q6_k_numpy(raw: np.ndarray) -> np.ndarray:
    """``q3_k_as_q6_k`` in numpy: the rule written out (and the library's test twin)."""
    b = check_rows(raw, Q3_K_BYTES, "Q3_K")
    hmask, qs, sc, d = b[:, :32], b[:, 32:96], b[:, 96:108], b[:, 108:110]
    # element h*128 + s*32 + l: bits 2s..2s+1 of qs[h*32 + l]; its high bit: bit h*4 + s of
    # hmask[l], set meaning "no -4" (the layout of gguf-py's and llama.cpp's dequantize)
    low = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    high = (hmask.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    q = low.reshape(-1, 256).astype(np.int8) - 4 * (1 - high.reshape(-1, 256)).astype(np.int8)
    lo = (sc[:, :8, None] >> np.array([0, 4], np.uint8)).transpose(0, 2, 1).reshape(-1, 16)
    hi = (sc[:, 8:, None] >> np.array([0, 2, 4, 6], np.uint8)).transpose(0, 2, 1).reshape(-1, 16)
    scales = ((lo & 0x0F) | ((hi & 0x03) << 4)).astype(np.int8) - np.int8(32)
    return _q6_k_blocks(q, scales, d).reshape(raw.shape[0], -1)


def _q6_k_blocks(q: np.ndarray, scales: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks ``[nb, 210]`` of values ``q`` int8 ``[nb, 256]`` in [-32, 31], int8
    ``scales`` ``[nb, 16]`` and fp16 bytes ``d`` ``[nb, 2]``."""
    u = (q.astype(np.int16) + 32).astype(np.uint8).reshape(-1, 2, 128)
    lo, hi = u & 0x0F, u >> 4
    ql = lo[:, :, :64] | (lo[:, :, 64:] << 4)  # element h*128 + b | h*128 + 64 + b
    qh = np.zeros((u.shape[0], 2, 32), np.uint8)
    for s in range(4):  # element h*128 + s*32 + l -> bits 2s..2s+1 of qh[h*32 + l]
        qh |= hi[:, :, s * 32:(s + 1) * 32] << (2 * s)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64),
                           scales.view(np.uint8), d], axis=1)


def q5_0_as_q8_0(raw: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0 rows ``[n, nb * 22]`` as Q8_0's int8 values ``[n, nb, 32]`` and fp16 scales
    ``[n, nb]`` of the same numbers (new arrays; in C on ``threads`` where the library
    builds, else ``q5_0_as_q8_0_numpy``)."""
    from radixlm.native import build

    b = check_rows(raw, Q5_0_BYTES, "Q5_0")
    n = raw.shape[0]
    if (lib := build.load()) is None:
        return q5_0_as_q8_0_numpy(raw)
    b = np.ascontiguousarray(b)
    q = np.empty((b.shape[0], 32), np.int8)
    d = np.empty(b.shape[0], np.float16)
    lib.rlm_q5_0_values(b.ctypes.data, b.shape[0], q.ctypes.data, d.ctypes.data, threads)
    return q.reshape(n, -1, 32), d.reshape(n, -1)


def q5_0_as_q8_0_numpy(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``q5_0_as_q8_0`` in numpy (the library's twin)."""
    b = check_rows(raw, Q5_0_BYTES, "Q5_0")
    qh = b[:, 2:6].copy().view("<u4")  # element j's fifth bit: bit j
    bits = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    qs = b[:, 6:]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # element j | j + 16
    q = (low | (bits << 4)).astype(np.int8) - np.int8(16)
    n = raw.shape[0]
    return q.reshape(n, -1, 32), b[:, :2].copy().view(np.float16).reshape(n, -1)


def iq4_as_q8_0(type_name: str, raw: np.ndarray, threads: int = 1) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """IQ4_NL / IQ4_XS rows ``[n, nb * 18 | 136]`` as Q8_0's int8 values ``[n, k/32, 32]``
    (the library's ``rlm_iq4_values`` on ``threads`` where built, else numpy) and fp16
    scales ``[n, k/32]`` (the module's docstring: IQ4_NL's exact, IQ4_XS's rounded). A
    ValueError where a scale is past fp16's range (only a damaged file's can be)."""
    from radixlm.native import build

    size = PENDING[type_name][0]
    b = check_rows(raw, size, type_name)
    at, groups = _IQ4_QS[type_name]
    if (lib := build.load()) is None:
        q = iq4_values_numpy(type_name, raw)
    else:
        q = np.empty((b.shape[0] * groups, 32), np.int8)
        lib.rlm_iq4_values(b.ctypes.data, b.shape[0], size, at, groups, q.ctypes.data,
                           threads)
    n = raw.shape[0]
    return q.reshape(n, -1, 32), iq4_scales(type_name, b, threads).reshape(n, -1)


def iq4_nibbles(type_name: str, raw: np.ndarray, threads: int = 1) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """IQ4_NL / IQ4_XS rows ``[n, nb * 18 | 136]`` as their nibbles ``[n, k/32, 16]`` (byte j:
    element j low, 16 + j high, indices into ``IQ4_GRID``) and the fp16 scales of
    ``iq4_as_q8_0`` ``[n, k/32]`` (``iq4_scales`` on ``threads``): IQ4_NL's both views of
    the file's blocks, IQ4_XS's nibbles a copy."""
    size = PENDING[type_name][0]
    b = check_rows(raw, size, type_name)
    n, at = raw.shape[0], _IQ4_QS[type_name][0]
    if type_name == "IQ4_NL":
        blocks = raw.reshape(n, -1, size)
        return blocks[..., at:], blocks[..., :2].view(np.float16)[..., 0]
    return (np.ascontiguousarray(b[:, at:]).reshape(n, -1, 16),
            iq4_scales(type_name, b, threads).reshape(n, -1))


def iq4_values_numpy(type_name: str, raw: np.ndarray) -> np.ndarray:
    """``iq4_as_q8_0``'s values in numpy ``[blocks * groups, 32]`` (the library's twin)."""
    at, _ = _IQ4_QS[type_name]
    qs = check_rows(raw, PENDING[type_name][0], type_name)[:, at:].reshape(-1, 16)
    return IQ4_GRID[np.concatenate([qs & 15, qs >> 4], axis=1)]


def iq4_scales(type_name: str, b: np.ndarray, threads: int = 1) -> np.ndarray:
    """The fp16 scale of each block of 32 of IQ4 blocks ``b`` ``[nb, bytes]`` (IQ4_XS's: the
    library's ``rlm_iq4xs_scales`` where built, else ``iq4_xs_scales_numpy``)."""
    from radixlm.native import build

    if type_name == "IQ4_NL":
        return b[:, :2].copy().view(np.float16).reshape(-1)
    if (lib := build.load()) is None:
        return iq4_xs_scales_numpy(b)
    scales = np.empty(b.shape[0] * 8, np.float32)
    lib.rlm_iq4xs_scales(b.ctypes.data, b.shape[0], scales.ctypes.data, threads)
    return _fp16_scales(scales)


def _fp16_scales(scales: np.ndarray) -> np.ndarray:
    """IQ4_XS's fp32 block scales (exact) rounded to the nearest fp16; a ValueError where one
    is past fp16's range."""
    with np.errstate(over="ignore"):
        out = scales.astype(np.float16)
    if not np.isfinite(out).all():
        raise ValueError("IQ4_XS block scales past fp16's range (d * (ls - 32))")
    return out


def iq4_xs_scales_numpy(b: np.ndarray) -> np.ndarray:
    """``iq4_scales`` of IQ4_XS blocks in numpy (the library's twin)."""
    d = b[:, :2].copy().view(np.float16)
    low = b[:, 4:8, None] >> np.array([0, 4], np.uint8)  # block j: nibble j % 2 of byte j / 2
    high = b[:, 2:4].copy().view("<u2") >> (2 * np.arange(8, dtype=np.uint16))  # bits 2j, 2j+1
    ls = (low.reshape(-1, 8) & 15) | ((high & 3).astype(np.uint8) << 4)
    return _fp16_scales((d.astype(np.float32) * (ls.astype(np.float32) - 32)).reshape(-1))
