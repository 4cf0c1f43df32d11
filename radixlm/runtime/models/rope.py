"""Rotary tables from a Hugging Face config: the inverse frequencies come from transformers'
own ``ROPE_INIT_FUNCTIONS`` (llama3, linear, yarn, longrope, ...), so a scaling type is
computed exactly as the reference computes it. Only "default" is written here, because
transformers keeps that one per model class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def rope_params(hf_config, layer_type: str | None = None) -> dict:
    """The rope parameter dict of the config (of ``layer_type`` for configs that keep one
    per layer type, e.g. Gemma 3's local and global layers)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling",
                                                                      None) or {}
    if layer_type is not None:
        params = params.get(layer_type) or {}
    return params


def per_layer_type(hf_config) -> bool:
    """Whether the config keeps one rope parameter dict per layer type."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    types = set(getattr(hf_config, "layer_types", None) or ())
    return bool(types) and types <= set(params)


def rope_inv_freq(hf_config, device: torch.device, layer_type: str | None = None,
                  **kwargs) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[rotary_dim / 2]`` and the attention scaling of cos/sin for the
    config's rope type/theta/scaling. ``kwargs`` go to transformers' init function (e.g.
    ``seq_len`` for longrope's long factors)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = rope_params(hf_config, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        partial = params.get("partial_rotary_factor",
                             getattr(hf_config, "partial_rotary_factor", 1.0))
        dim = int(head_dim * partial)
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        return inv.to(device), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope type {rope_type!r} is not supported")
    if layer_type is not None:
        kwargs["layer_type"] = layer_type
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, device, **kwargs)
    return inv.float(), float(scaling)


@dataclass
class Rope:
    """One rotary table. ``long_inv_freq`` (longrope): positions ``>= switch`` rotate with
    the long factors, earlier ones with the short ones. transformers switches a whole forward
    pass to the long factors once its longest position passes ``switch``; per position is
    the same for token-by-token decode and keeps a cached prefix valid whatever follows."""

    inv_freq: torch.Tensor  # [rotary_dim / 2] fp32
    scaling: float = 1.0
    long_inv_freq: torch.Tensor | None = None
    switch: int = 0

    @classmethod
    def from_hf(cls, hf_config, device: torch.device, layer_type: str | None = None) -> Rope:
        inv, scaling = rope_inv_freq(hf_config, device, layer_type)
        params = rope_params(hf_config, layer_type)
        if params.get("rope_type", params.get("type")) != "longrope":
            return cls(inv, scaling)
        switch = int(params.get("original_max_position_embeddings")
                     or hf_config.original_max_position_embeddings)
        long_inv, _ = rope_inv_freq(hf_config, device, layer_type, seq_len=switch + 1)
        return cls(inv, scaling, long_inv, switch)

    @property
    def rotary_dim(self) -> int:
        return 2 * int(self.inv_freq.numel())

    def cos_sin(self, ops, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, rotary_dim / 2]`` of ``positions``, attention scaling applied."""
        cos, sin = ops.rotary_cos_sin(positions, self.inv_freq, dtype)
        if self.long_inv_freq is not None:
            long_cos, long_sin = ops.rotary_cos_sin(positions, self.long_inv_freq, dtype)
            far = (positions >= self.switch)[:, None]
            cos, sin = torch.where(far, long_cos, cos), torch.where(far, long_sin, sin)
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos, sin
