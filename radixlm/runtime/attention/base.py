"""Attention backends: the one place that reads and writes the KV pool.

A backend is constructed with the ``KVPool`` (per-layer ``k_buffer[layer]`` and
``v_buffer[layer]`` of shape ``[capacity, num_kv_heads, head_dim]``, and the
``req_to_token`` table ``[max_running, max_context]`` int32). Requests' earlier K/V are
read through ``req_to_token`` in place: a radix-shared prefix is never copied.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from radixlm.runtime.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttnLayerOptions:
    """How one layer attends: ``softmax(cap(q·k * scale))`` with ``cap(s) = softcap *
    tanh(s / softcap)`` when ``softcap`` is set, over the keys at positions ``p - window <
    j <= p`` of a query at position ``p`` (all ``j <= p`` when ``window`` is None)."""

    scale: float
    softcap: float | None = None
    window: int | None = None

    @property
    def plain(self) -> bool:
        return self.softcap is None and self.window is None


class AttentionBackend(ABC):
    #: whether the backend honours ``AttnLayerOptions.softcap`` and ``.window``
    supports_softcap_and_window = False

    def __init__(self, pool, num_heads: int, num_kv_heads: int, head_dim: int,
                 layers: list[AttnLayerOptions] | None = None) -> None:
        """``layers``: per-layer options; None means ``head_dim ** -0.5`` and full causal
        attention on every layer."""
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.layers = layers or [AttnLayerOptions(self.scale)] * len(pool.k_buffer)
        if not self.supports_softcap_and_window and not all(o.plain for o in self.layers):
            raise ValueError(f"{type(self).__name__} has no attention soft-capping or sliding "
                             "window, which this model needs; use attention_backend='torch'")

    def init_forward_metadata(self, batch: ForwardBatch) -> None:  # noqa: B027
        """Called once per step before the first layer; may precompute index tensors and
        store them in ``batch.attn_metadata``."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Store ``k, v`` at ``batch.out_cache_loc`` in layer ``layer_id`` of the pool, then
        attend (causally within each request, over its whole prefix). Returns ``[T, H, D]``."""


# name -> "module:Class"; imported lazily so CPU-only installs never import triton.
ATTENTION_BACKENDS = {
    "torch": "radixlm.runtime.attention.torch_backend:TorchAttentionBackend",
    "triton": "radixlm.runtime.attention.triton_backend:TritonAttentionBackend",
}


def resolve_backend_name(name: str, device: torch.device, plain: bool = True) -> str:
    """``plain``: no layer needs soft-capping or a sliding window (only torch has them)."""
    if name == "auto":
        return "triton" if device.type == "cuda" and plain else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend must be one of {['auto', *ATTENTION_BACKENDS]}, got {name!r}"
        )
    return name


# name -> the backend's batch-invariant variant (enable_deterministic_inference)
INVARIANT_BACKENDS = {
    "torch": "radixlm.runtime.attention.invariant:InvariantAttentionBackend",
}


def create_attention_backend(name: str, pool, num_heads: int, num_kv_heads: int,
                             head_dim: int, invariant: bool = False,
                             **options) -> AttentionBackend:
    """Instantiate a registered backend (``invariant``: its batch-invariant variant, a
    KeyError for a backend without one); ``options`` are backend-specific keywords."""
    module_name, cls_name = (INVARIANT_BACKENDS if invariant
                             else ATTENTION_BACKENDS)[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(pool, num_heads, num_kv_heads, head_dim, **options)
