"""A GGUF whose matrices stay blocks in the native library: the model object of the native
path when the file is read as a GGUF.

It holds what is not a matrix (config, norms, biases, the rotary tables) and no dense weight:
every step runs natively (``NativeDecoder(max_rows=None)``), the embedding is looked up in
its blocks, and the LM head is a block matrix too. ``forward`` is never called: the torch
path has no weights to run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixlm.kernels.dispatch import get_ops
from radixlm.runtime.models.rope import layer_ropes
from radixlm.runtime.models.shape import FULL, ModelConfig


@dataclass
class NativeLayer:
    """One layer's vectors; ``qkv`` .. ``down`` are None (their blocks are the decoder's).
    The norms are the scales the layer multiplies by (a Gemma file's are ``1 + w``
    already, as llama.cpp writes them)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor  # the MLP's input norm
    qkv_bias: torch.Tensor | None
    rope_pairs: bool
    rope_key: str = FULL  # its rotary table (``NativeGGUFModel.ropes``)
    q_norm: torch.Tensor | None = None  # [head_dim] (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # [hidden] (Gemma's sandwich norms)
    mlp_out_norm: torch.Tensor | None = None
    qkv: None = None
    o_proj: None = None
    gate_up: None = None
    down: None = None


class NativeGGUFModel:
    """``vectors``: HF name -> fp32 vector (norms, biases) of the file; ``rope_pairs``: q/k
    rows in llama.cpp's order (rotary on adjacent pairs). ``dtype``: the precision the K/V
    pool and the activation rule go by (the weights are the file's blocks)."""

    def __init__(self, hf_config, vectors: dict[str, np.ndarray], dtype: torch.dtype,
                 device: torch.device, rope_pairs: bool) -> None:
        self.hf_config = hf_config
        self.cfg = cfg = ModelConfig.from_hf(hf_config)
        self.dtype, self.device = dtype, device
        self.ops = get_ops(device)
        self.tp = None

        def vec(name: str) -> torch.Tensor:
            if name not in vectors:
                raise ValueError(f"tensor {name!r} missing from the model file")
            return torch.from_numpy(np.array(vectors[name], dtype=np.float32))

        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            bias = None
            if f"{p}self_attn.q_proj.bias" in vectors:
                bias = torch.cat([vec(f"{p}self_attn.{x}_proj.bias") for x in "qkv"])
            qk = [vec(f"{p}self_attn.{x}_norm.weight") for x in "qk"] if cfg.qk_norm else []
            sandwich = {}
            if cfg.sandwich_norm:  # Gemma: the attention's and the MLP's outputs normed too
                sandwich = {"attn_out_norm": vec(p + "post_attention_layernorm.weight"),
                            "mlp_out_norm": vec(p + "post_feedforward_layernorm.weight")}
            self.layers.append(NativeLayer(
                vec(p + "input_layernorm.weight"),
                vec(p + ("pre_feedforward_layernorm.weight" if cfg.sandwich_norm
                         else "post_attention_layernorm.weight")), bias, rope_pairs,
                cfg.layer_types[i] if cfg.layer_types else FULL, *qk, **sandwich))
        self.norm = vec("model.norm.weight")
        self.embed = self.lm_head = self.head = None
        self.ropes = layer_ropes(hf_config, device, {layer.rope_key for layer in self.layers})

    @property
    def vocab_size(self) -> int:
        return int(self.cfg.vocab_size)

    def native_unsupported(self) -> str | None:
        return None

    def forward(self, batch, attn) -> torch.Tensor:
        raise RuntimeError("a GGUF read as a GGUF runs every step natively")
