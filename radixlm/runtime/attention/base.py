"""Attention backends: the one place that reads and writes the KV pool.

A backend is constructed with the ``KVPool`` (per-layer ``k_buffer[layer]`` and
``v_buffer[layer]`` of shape ``[capacity, num_kv_heads, head_dim]``, and the
``req_to_token`` table ``[max_running, max_context]`` int32). Requests' earlier K/V are
read through ``req_to_token`` in place: a radix-shared prefix is never copied.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod

import torch

from radixlm.runtime.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    def __init__(self, pool, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

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


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend must be one of {['auto', *ATTENTION_BACKENDS]}, got {name!r}"
        )
    return name


def create_attention_backend(name: str, pool, num_heads: int, num_kv_heads: int,
                             head_dim: int, **options) -> AttentionBackend:
    """Instantiate a registered backend; ``options`` are backend-specific keywords."""
    module_name, cls_name = ATTENTION_BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(pool, num_heads, num_kv_heads, head_dim, **options)
