"""Run the Triton kernels where there is no GPU: Triton's CPU interpreter, for tests.

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
import torch

TRITON_JIT_MODULES = ("triton.language.standard", "triton.language.random", "triton.language")
KERNEL_MODULES = (
    "radixlm.kernels.norm",
    "radixlm.kernels.activation",
    "radixlm.kernels.rotary",
    "radixlm.kernels.kv_store",
    "radixlm.kernels.bitmask",
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
