"""The one point where the model picks its kernels: Triton on CUDA, the torch twins elsewhere.

    ops = get_ops(device)
    h, residual = ops.rmsnorm(x, weight, eps, residual)

Every op has the signature of its twin in ``radixlm.kernels.ref``. Two behaviours differ
between implementations and callers must not depend on either: ``apply_rotary`` may rotate
``q``/``k`` in place (Triton does; use the returned tensors), and ``rmsnorm`` with a residual
may reuse its inputs' storage for the results. ``apply_token_bitmask`` is in place in both.

``RADIXLM_KERNELS`` = ``auto`` (default) | ``ref`` | ``triton`` forces a choice. ``triton`` on
a CPU device only works under ``TRITON_INTERPRET=1`` (that is how the kernel tests run).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm import envs
from radixlm.kernels import ref

logger = logging.getLogger(__name__)
KERNELS_ENV = "RADIXLM_KERNELS"  # declared in radixlm.envs (kernels_override)
KERNEL_CHOICES = ("auto", "ref", "triton")


@dataclass(frozen=True)
class KernelOps:
    """A namespace of kernel functions; see ``radixlm.kernels.ref`` for each contract."""

    name: str  # "ref" | "triton"
    rmsnorm: Callable
    silu_and_mul: Callable
    gelu_tanh_and_mul: Callable
    rotary_cos_sin: Callable
    apply_rotary: Callable
    store_kv: Callable
    store_kv_int8: Callable
    apply_token_bitmask: Callable
    decode_attention: Callable
    extend_attention: Callable


REF_OPS = KernelOps(
    name="ref",
    rmsnorm=ref.rmsnorm,
    silu_and_mul=ref.silu_and_mul,
    gelu_tanh_and_mul=ref.gelu_tanh_and_mul,
    rotary_cos_sin=ref.rotary_cos_sin,
    apply_rotary=ref.apply_rotary,
    store_kv=ref.store_kv,
    store_kv_int8=ref.store_kv_int8,
    apply_token_bitmask=ref.apply_token_bitmask,
    decode_attention=ref.decode_attention,
    extend_attention=ref.extend_attention,
)


@functools.lru_cache(maxsize=1)
def triton_ops() -> KernelOps:
    """The Triton kernels (imported lazily: CPU-only installs never import triton)."""
    from radixlm.kernels import (
        activation,
        attention_decode,
        attention_extend,
        bitmask,
        kv_store,
        norm,
        rotary,
    )

    return KernelOps(
        name="triton",
        rmsnorm=norm.rmsnorm,
        silu_and_mul=activation.silu_and_mul,
        gelu_tanh_and_mul=ref.gelu_tanh_and_mul,  # Gemma only; torch ops are fine on CUDA
        rotary_cos_sin=ref.rotary_cos_sin,  # a few elementwise torch ops; not worth a kernel
        apply_rotary=rotary.apply_rotary,
        store_kv=kv_store.store_kv,
        store_kv_int8=kv_store.store_kv_int8,
        apply_token_bitmask=bitmask.apply_token_bitmask,
        decode_attention=attention_decode.decode_attention,
        extend_attention=attention_extend.extend_attention,
    )


def kernels_choice() -> str:
    """The value of ``RADIXLM_KERNELS`` (validated; ``auto`` when unset)."""
    choice = (envs.kernels_override() or "auto").strip().lower() or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_ENV} must be one of {KERNEL_CHOICES}, got {choice!r}")
    return choice


def get_ops(device: torch.device | str) -> KernelOps:
    """Kernels for tensors on ``device``: Triton on CUDA, the torch twins otherwise, unless
    ``RADIXLM_KERNELS`` forces one. ``auto`` on CUDA falls back to the twins (with a
    warning) where triton cannot be imported."""
    choice = kernels_choice()
    if choice == "ref" or (choice == "auto" and torch.device(device).type != "cuda"):
        return REF_OPS
    try:
        return triton_ops()
    except ImportError:
        if choice == "triton":
            raise
        logger.warning("triton is not importable; using the torch reference kernels on %s",
                       device)
        return REF_OPS
