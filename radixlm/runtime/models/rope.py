"""Rotary tables from a Hugging Face config: the inverse frequencies of "default", "linear" and
"llama3" written here as transformers computes them (importing transformers costs a start
~0.6 s), the others (yarn, longrope, dynamic, ...) from transformers' own
``ROPE_INIT_FUNCTIONS``, so a scaling type is computed exactly as the reference computes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixlm.native.file_config import FileConfig
from radixlm.runtime.models.shape import per_layer_type, rope_params


def rope_inv_freq(hf_config, device: torch.device, layer_type: str | None = None,
                  **kwargs) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[rotary_dim / 2]`` and the attention scaling of cos/sin for the
    config's rope type/theta/scaling. "default", "linear" and "llama3" are computed here, op
    for op as transformers' functions compute them (the same bits, tested); the others by
    transformers' init function (``kwargs`` go to it, e.g. ``seq_len`` for longrope's long
    factors), given transformers' own config (``FileConfig.hf``)."""
    params = rope_params(hf_config, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in ("default", "linear", "llama3"):
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        head_dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads)
        partial = params.get("partial_rotary_factor",
                             getattr(hf_config, "partial_rotary_factor", 1.0))
        dim = int(head_dim * partial)
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        if rope_type == "linear":
            inv = inv / params["factor"]
        elif rope_type == "llama3":
            inv = _llama3(inv, params, hf_config.max_position_embeddings)
        return inv.to(device), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope type {rope_type!r} is not supported")
    if layer_type is not None:
        kwargs["layer_type"] = layer_type
    config = hf_config.hf() if isinstance(hf_config, FileConfig) else hf_config
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, device, **kwargs)
    return inv.float(), float(scaling)


def _llama3(inv: torch.Tensor, params: dict, max_positions: int) -> torch.Tensor:
    """Llama 3.1's scaling of the base frequencies ``inv`` (transformers'
    ``_compute_llama3_parameters``, in its order of operations)."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old = params.get("original_max_position_embeddings", max_positions)
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


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


def layer_ropes(hf_config, device: torch.device, types) -> dict[str, Rope]:
    """One ``Rope`` per layer type in ``types`` (each type's own parameters where the config
    keeps one dict per type, else the config's one), as both model classes hold them."""
    per_type = per_layer_type(hf_config)
    return {t: Rope.from_hf(hf_config, device, t if per_type else None) for t in sorted(types)}
