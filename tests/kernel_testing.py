"""Test helpers for the Triton kernels: run them where there is no GPU (Triton's CPU
interpreter), and compile them ahead of time for a GPU that is not there.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is *decorated*, so it must be
set before the kernel modules are imported. ``enable_interpreter_without_cuda`` sets it
(only when CUDA is unavailable), re-imports kernel modules imported earlier without it, and
fixes two bf16 bugs of the Triton 3.9 interpreter so that it computes what the GPU does:

* ``tl.dot`` on bf16 operands multiplies their uint16 bit patterns as integers;
* fp32 -> bf16 casts (and stores) truncate instead of rounding to nearest even.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# A kernel test's devices: Triton's interpreter on a host without CUDA, the GPU where there is
# one (CUDA tests skip only where no GPU is present).
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(HAS_CUDA, reason="interpreter off on CUDA")),
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")]),
]
DTYPES = [torch.float32, torch.bfloat16]

TRITON_JIT_MODULES = ("triton.language.standard", "triton.language.random", "triton.language")
KERNEL_MODULES = (
    "radixlm.kernels.norm",
    "radixlm.kernels.activation",
    "radixlm.kernels.rotary",
    "radixlm.kernels.kv_store",
    "radixlm.kernels.bitmask",
    "radixlm.kernels.attention_common",  # before the kernels that call its functions
    "radixlm.kernels.attention_decode",
    "radixlm.kernels.attention_extend",
    "radixlm.runtime.attention.triton_backend",  # last: binds the kernels at import
)


def enable_interpreter_without_cuda() -> bool:
    """Without CUDA, turn on ``TRITON_INTERPRET=1`` for this process and make every kernel
    module interpreted. Returns True when kernels will run interpreted."""
    if torch.cuda.is_available():
        return False
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        # Modules decorated before this point (Triton's own ``tl.sum``, ``tl.cdiv``... among
        # them) are compiled-mode functions the interpreter cannot call: decorate them again.
        loaded = [name for name in TRITON_JIT_MODULES + KERNEL_MODULES if name in sys.modules]
        for name in loaded:
            importlib.reload(sys.modules[name])
        if "radixlm.kernels.dispatch" in sys.modules:
            sys.modules["radixlm.kernels.dispatch"].triton_ops.cache_clear()
    _patch_interpreter_bf16()
    return True


def _bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _fp32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    fp32 = torch.from_numpy(np.array(values, dtype=np.float32))  # a copy, any ndim
    return fp32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _patch_interpreter_bf16() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_radixlm_bf16_patched", False):
        return
    cast_impl, create_dot = builder.cast_impl, builder.create_dot

    def patched_cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_fp32_to_bf16_bits(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    def patched_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(_bf16_bits_to_fp32(a.data), tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = interpreter.TensorHandle(_bf16_bits_to_fp32(b.data), tl.float32)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.cast_impl = patched_cast
    builder.create_dot = patched_dot
    builder._radixlm_bf16_patched = True


_POINTER_ARGS = {
    "req_to_token_ptr": "*i32", "req_pool_indices_ptr": "*i64", "seq_lens_ptr": "*i64",
    "prefix_lens_ptr": "*i64", "extend_lens_ptr": "*i64", "extend_start_loc_ptr": "*i64",
    "mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32", "loc_ptr": "*i64", "logits_ptr": "*fp32",
    "mask_ptr": "*i32", "scale": "fp32", "eps": "fp32", "k_scale_ptr": "*bf16",
    "v_scale_ptr": "*bf16",
}


def _pointer_types(dtype: str) -> dict[str, str]:
    """Triton signature types of the kernels' arguments: tensors of ``dtype``, the index
    and fp32 scratch pointers and fp32 scalars (every other argument is i32)."""
    data = ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr", "x_ptr", "res_ptr", "w_ptr",
            "h_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr")
    return {**{p: f"*{dtype}" for p in data}, **_POINTER_ARGS}


def compile_kernels_for_gpu(arch: int = 90, dtypes: tuple[str, ...] = ("bf16",),
                            head_dims: tuple[int, ...] = (64, 128)) -> list[str]:
    """Compile every kernel ahead of time for ``sm_<arch>`` (no GPU needed: Triton ships
    ``ptxas``), in the configurations the wrappers launch. Catches what the interpreter
    cannot: type errors of compiled control flow, dot shape limits, shared memory overflow.
    Must run in a process where ``TRITON_INTERPRET`` was never set. Returns one line per
    compiled kernel; raises on the first failure."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.kernels import (
        activation,
        attention_decode,
        attention_extend,
        bitmask,
        kv_store,
        norm,
        rotary,
    )
    from radixlm.kernels.triton_utils import dot_precision

    target, done = GPUTarget("cuda", arch, 32), []

    def build(kernel, types: dict[str, str], constexprs: dict, num_warps: int = 4,
              num_stages: int = 2) -> None:
        params = list(inspect.signature(kernel.fn).parameters)
        signature = {p: "constexpr" if p in constexprs else types.get(p, "i32") for p in params}
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={(params.index(k),): v for k, v in constexprs.items()})
        compiled = triton.compile(source, target=target,
                                  options={"num_warps": num_warps, "num_stages": num_stages})
        done.append(f"{kernel.fn.__name__} {constexprs} smem={compiled.metadata.shared}")

    for dtype in dtypes:
        types = _pointer_types(dtype)
        precision = dot_precision(getattr(torch, {"bf16": "bfloat16", "fp32": "float32",
                                                  "fp16": "float16"}[dtype]))
        int8_types = {**types, "k_cache_ptr": "*i8", "v_cache_ptr": "*i8"}  # an int8 pool
        for d in head_dims:
            dec = attention_decode.launch_config(d)
            ext = attention_extend.launch_config(d)
            for int8, kv_types in ((False, types), (True, int8_types)):
                build(attention_decode._decode_stage1_kernel, kv_types,
                      {"BLOCK_H": 16, "BLOCK_N": dec.block_n, "BLOCK_D": d, "EVEN_D": True,
                       "KV_INT8": int8, "DOT_PRECISION": precision}, dec.num_warps,
                      dec.num_stages)
                build(attention_extend._extend_kernel, kv_types,
                      {"BLOCK_M": ext.block_m, "BLOCK_N": ext.block_n, "BLOCK_D": d,
                       "EVEN_D": True, "KV_INT8": int8, "DOT_PRECISION": precision},
                      ext.num_warps, ext.num_stages)
            build(attention_decode._decode_stage2_kernel, types, {"BLOCK_D": d}, num_warps=1)
            for kernel, params, kernel_types in (
                    (rotary._rotary_kernel, rotary.launch_params(32, 8, d), types),
                    (kv_store._store_kv_kernel, kv_store.launch_params(8, d), types),
                    (kv_store._store_kv_int8_kernel, kv_store.launch_params(8, d), int8_types)):
                params = dict(params)
                build(kernel, kernel_types, params, num_warps=params.pop("num_warps"))
        for has_residual in (False, True):
            build(norm._rmsnorm_kernel, types, {"HAS_RESIDUAL": has_residual, "BLOCK": 1024})
        build(activation._silu_and_mul_kernel, types, {"BLOCK": 1024})
    build(bitmask._bitmask_kernel, _POINTER_ARGS, {"BLOCK": 1024})
    return done
