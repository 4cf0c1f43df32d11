"""Llama-family decoder (Llama/SmolLM2, Mistral, Qwen2) on the KV pool.

The model never sees requests: it gets a ``ForwardBatch`` of flattened new tokens, writes
their K/V into the pool through the attention backend, and returns logits only for
``batch.logits_indices`` (the last position of each request, plus prompt positions whose
logprobs were asked for). Fused ops come from one dispatch point (``radixlm.kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.kernels.dispatch import get_ops
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.models.quant import Linear, pack_int4, quantize_int4, quantize_int8


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_hf(cls, cfg) -> ModelConfig:
        if cfg.model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"model_type {cfg.model_type!r} is not supported (Llama-family only)")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.rms_norm_eps,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            qkv_bias=cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def rope_inv_freq(hf_config, device: torch.device) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling for the config's rope type/theta/scaling."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    rope_type = (params or {}).get("rope_type", (params or {}).get("type", "default"))
    if rope_type == "default":
        theta = (params or {}).get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        dim = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads
        )
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        return inv.to(device), 1.0
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, device)
    return inv.float(), float(scaling)


def _fused_linear(w: dict, names: list[str], bias: torch.Tensor | None, int4: dict | None):
    """One Linear over the row-concatenation of ``names`` (e.g. q, k, v projections).
    ``int4``: HF name -> (q, scale, zero) of exact source blocks, or {} to quantize."""
    weight = torch.cat([w[n + ".weight"] for n in names])
    packed = None
    if int4 is not None:
        if all(n in int4 for n in names):
            q, sc, z = (torch.cat([int4[n][i] for n in names]) for i in range(3))
            packed = pack_int4(q, sc, z)
        else:
            packed = quantize_int4(weight)
    return Linear(weight, bias, packed)


class LlamaLayer:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], layer_id: int,
                 int4: dict | None = None) -> None:
        self.cfg, self.layer_id = cfg, layer_id
        self.input_norm = w["input_layernorm.weight"]
        self.post_norm = w["post_attention_layernorm.weight"]
        qkv_bias = (
            torch.cat([w["self_attn.q_proj.bias"], w["self_attn.k_proj.bias"],
                       w["self_attn.v_proj.bias"]])
            if cfg.qkv_bias and "self_attn.q_proj.bias" in w else None
        )
        self.qkv = _fused_linear(w, ["self_attn.q_proj", "self_attn.k_proj",
                                     "self_attn.v_proj"], qkv_bias, int4)
        self.o_proj = _fused_linear(w, ["self_attn.o_proj"], None, int4)
        self.gate_up = _fused_linear(w, ["mlp.gate_proj", "mlp.up_proj"], None, int4)
        self.down = _fused_linear(w, ["mlp.down_proj"], None, int4)
        # tensor parallel: sum of the row-parallel o/down partial outputs over the ranks
        self.all_reduce = None

    def forward(self, h, residual, cos, sin, attn, batch: ForwardBatch, ops):
        cfg = self.cfg
        if residual is None:
            residual = h
            x = ops.rmsnorm(h, self.input_norm, cfg.rms_norm_eps)
        else:
            x, residual = ops.rmsnorm(h, self.input_norm, cfg.rms_norm_eps, residual)
        qkv = self.qkv(x)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, cfg.head_dim)  # (T, H, D)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)  # (T, Hkv, D)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        q, k = ops.apply_rotary(q, k, cos, sin)
        o = attn.forward(q, k, v, self.layer_id, batch)  # (T, H, D)
        h = self.o_proj(o.reshape(-1, cfg.q_size))
        if self.all_reduce is not None:
            h = self.all_reduce(h)
        x, residual = ops.rmsnorm(h, self.post_norm, cfg.rms_norm_eps, residual)
        h = self.down(ops.silu_and_mul(self.gate_up(x)))
        if self.all_reduce is not None:
            h = self.all_reduce(h)
        return h, residual


class LlamaModel:
    """Weights as plain tensors (no nn.Module bookkeeping in the hot path)."""

    def __init__(self, hf_config, state: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, int4: dict | None = None, tp=None) -> None:
        """``int4``: None for plain weights; else HF name -> (q, scale, zero) of exact
        source blocks (missing names are quantized from the weights). ``tp``: None, or the
        rank's ``TPGroup`` when ``hf_config``/``state`` describe one tensor-parallel shard
        (see radixlm/runtime/parallel/sharding.py)."""
        self.hf_config = hf_config
        self.tp = tp
        self.cfg = cfg = ModelConfig.from_hf(hf_config)
        self.dtype, self.device = dtype, device
        self.ops = get_ops(device)

        def get(name: str) -> torch.Tensor:
            if name not in state:
                raise ValueError(f"weight {name!r} missing from checkpoint")
            return state[name].to(device=device, dtype=dtype).contiguous()

        self.embed = get("model.embed_tokens.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            prefix = f"model.layers.{i}."
            w = {k[len(prefix):]: get(k) for k in state if k.startswith(prefix)}
            blocks = None if int4 is None else {
                k[len(prefix):].rsplit(".", 1)[0]: v for k, v in int4.items()
                if k.startswith(prefix)}
            self.layers.append(LlamaLayer(cfg, w, i, blocks))
            if tp is not None:
                self.layers[-1].all_reduce = tp.all_reduce
        self.norm = get("model.norm.weight")
        if cfg.tie_word_embeddings or "lm_head.weight" not in state:
            self.lm_head = self.embed
        else:
            self.lm_head = get("lm_head.weight")
        self.inv_freq, self.rope_scaling = rope_inv_freq(hf_config, device)
        # With weight-only decode linears, the head (a third of a batch-1 step) gets int8
        # channels too (its GGUF source is Q8_0, blocks of 32: ~1% logit error vs bf16).
        self.head = Linear(self.lm_head, None,
                           int8=quantize_int8(self.lm_head) if int4 is not None else None)

    @property
    def vocab_size(self) -> int:
        return self.tp.vocab_size if self.tp is not None else int(self.lm_head.shape[0])

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), V]`` in fp32."""
        ops, cfg = self.ops, self.cfg
        if self.tp is not None:  # vocab-parallel
            h = self.tp.embed(batch.input_ids, self.embed)  # (T, hidden)
        else:
            h = F.embedding(batch.input_ids, self.embed)  # (T, hidden)
        cos, sin = ops.rotary_cos_sin(batch.positions, self.inv_freq, self.dtype)
        if self.rope_scaling != 1.0:
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        residual = None
        for layer in self.layers:
            h, residual = layer.forward(h, residual, cos, sin, attn, batch, ops)
        h = h[batch.logits_indices]
        residual = residual[batch.logits_indices]
        h, _ = ops.rmsnorm(h, self.norm, cfg.rms_norm_eps, residual)
        logits = self.head(h)
        if self.tp is not None:  # vocab-parallel: each rank has a block of columns
            logits = self.tp.gather_logits(logits)
        return logits.float()
