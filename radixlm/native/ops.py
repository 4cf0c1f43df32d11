"""Thin torch-facing wrappers of single native ops (kernel tests and benchmarks call these;
the engine runs whole layers through ``decoder``, and its sampler a grammar's bitmask
through ``bitmask_applier``)."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from radixlm.kernels import ref
from radixlm.native.arena import BLOCKS32, REPACKED, Arena, _qmat, repack
from radixlm.native.build import ACT_BF16, ACT_F32, ACT_GELU_TANH, ACT_INT8, ACT_SILU, QMat
from radixlm.native.qweights import QWeight

KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}  # csrc/rlm.h KV_*


def qmat(w: QWeight, keep: list, lib=None) -> QMat:
    """The C view of ``w`` where its arrays lie (kernel tests; the engine copies into an
    ``Arena``); ``keep`` holds the arrays it points into. With ``lib``, K-quant rows are
    repacked for its int8 kernel where it reads them so (as the ``Arena`` does)."""
    w = w.materialized()
    arrays = [np.ascontiguousarray(a) for a in Arena.arrays(w)]
    keep.extend(arrays)
    kx32 = w.fmt in BLOCKS32 and lib is not None and lib.rlm_kx32_rows() and w.n % 16 == 0
    if not kx32 and (lib is None or not lib.rlm_kx_rows() or w.fmt not in REPACKED
                     or w.n < 16):
        return _qmat(w, arrays)
    repacked = np.empty(int(lib.rlm_kx_bytes(w.fmt, w.n, w.k)), dtype=np.uint8)
    repack(lib, w, repacked)  # (the plain arrays kept too: the other activation modes read them)
    keep.append(repacked)
    return _qmat(w, arrays, repacked)


ACT_MODES = {"int8": ACT_INT8, "fp32": ACT_F32, "bf16": ACT_BF16}


def norm_matmul(lib, x: torch.Tensor, w: QWeight, act: str = "fp32",
                norm: torch.Tensor | None = None, eps: float = 1e-5,
                threads: int | None = None, repack: bool = True) -> torch.Tensor:
    """``rmsnorm(x) @ W.T`` (no norm when ``norm`` is None) for ``x [T, k]`` fp32, with the
    activations read as ``act`` (fp32 | int8 | bf16; the twin: ``qmatmul`` of
    tests/native_ref.py); ``repack``: K-quant rows also repacked where the engine's are
    (``qmat``)."""
    keep: list = []
    m = qmat(w, keep, lib if repack else None)
    x = x.float().contiguous()
    t = x.shape[0]
    threads = threads or torch.get_num_threads()
    out = torch.empty(t, w.n, dtype=torch.float32)
    ws = torch.empty(lib.rlm_matmul_workspace_floats(t, w.k, threads), dtype=torch.float32)
    norm_ptr = None if norm is None else norm.float().contiguous()
    lib.rlm_norm_head(ctypes.byref(m), None if norm_ptr is None else norm_ptr.data_ptr(), eps,
                      t, x.data_ptr(), out.data_ptr(), ws.data_ptr(), ACT_MODES[act], threads)
    return out


def act_mul(lib, g: torch.Tensor, u: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """``act(g) * u`` elementwise (1-D fp32; ``act`` silu | gelu_tanh), the layer's own
    code."""
    g, u = g.float().contiguous(), u.float().contiguous()
    out = torch.empty_like(g)
    lib.rlm_act_mul(g.data_ptr(), u.data_ptr(), g.numel(), out.data_ptr(),
                    {"silu": ACT_SILU, "gelu_tanh": ACT_GELU_TANH}[act])
    return out


def quantize_act(lib, x: torch.Tensor, block: int = 32):
    """The kernel's int8 activation blocks of ``x [T, k]``: (a, d, s); ``block=256`` the
    K-quants' (a, d per 256, the int16 sums of a by 16)."""
    x = x.float().contiguous()
    t, k = x.shape
    a = torch.empty(t, k, dtype=torch.int8)
    if block == 256:
        d, sums = torch.empty(t, k // 256), torch.empty(t, k // 16, dtype=torch.int16)
        lib.rlm_quantize_rows_k(x.data_ptr(), t, k, a.data_ptr(), d.data_ptr(), sums.data_ptr())
        return a, d, sums
    d = torch.empty(t, k // 32)
    s = torch.empty(t, k // 32)
    lib.rlm_quantize_rows(x.data_ptr(), t, k, a.data_ptr(), d.data_ptr(), s.data_ptr())
    return a, d, s


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def attention(lib, q: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor,
              req_to_token: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              scale: float, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """The layer's attention on its own (the contract: ``attention`` of
    tests/native_ref.py). int8 caches come with their bf16 row scales ``[S, Hkv]``."""
    q = q.float().contiguous()
    t, heads, dim = q.shape
    out = torch.empty_like(q)
    rows, pos = rows.long().contiguous(), pos.long().contiguous()
    lib.rlm_attention(q.data_ptr(), t, heads, k_cache.shape[1], dim, scale, rows.data_ptr(),
                      pos.data_ptr(), req_to_token.data_ptr(), req_to_token.stride(0),
                      k_cache.data_ptr(), v_cache.data_ptr(), KV_DTYPES[k_cache.dtype],
                      int(pos.max()) + 1, out.data_ptr(), _ptr(k_scale), _ptr(v_scale),
                      softcap)
    return out


def store_kv(lib, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor,
             scales: torch.Tensor | None = None) -> None:
    """Store ``x [T, Hkv, D]`` (fp32) at ``slots`` of ``cache`` (fp32, bf16, or int8 with
    its bf16 row ``scales``) as the layer stores K or V."""
    x = x.float().contiguous()
    slots = slots.long().contiguous()
    t, heads, dim = x.shape
    lib.rlm_store_kv(x.data_ptr(), t, heads, dim, slots.data_ptr(), cache.data_ptr(),
                     _ptr(scales), KV_DTYPES[cache.dtype])


def bitmask_applier(lib):
    """``ref.apply_token_bitmask`` in C, its contract (in place; the same -inf where a bit
    is clear or past the mask): the sampler's on a host with the library (9 rows of 49k
    tokens: 289 -> 31 us on a Zen 5). What the C op does not take (logits
    not fp32 rows on the CPU, a mask not int32 rows on the CPU, row counts that differ)
    goes to the torch twin."""

    def apply(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        if (logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.dim() != 2
                or logits.stride(1) != 1 or bitmask.dtype != torch.int32
                or bitmask.device.type != "cpu" or bitmask.dim() != 2
                or not bitmask.is_contiguous() or bitmask.shape[0] != logits.shape[0]):
            return ref.apply_token_bitmask(logits, bitmask)
        lib.rlm_apply_bitmask(logits.data_ptr(), logits.stride(0), logits.shape[0],
                              logits.shape[1], bitmask.data_ptr(), bitmask.shape[1])
        return logits

    return apply
