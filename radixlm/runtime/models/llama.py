"""Llama-family decoders on the KV pool: Llama 2/3.x (SmolLM2), Mistral, Qwen2/2.5, Qwen3,
Gemma 2/3 (text), Phi-3.

They share one layer: pre-norm attention and gated MLP with fused add-norms. What differs
between families is a handful of switches in ``ModelConfig`` (read from the HF config in
``from_hf``): q/k RMSNorm per head (Qwen3, Gemma 3), "sandwich" norms around each sublayer
and RMSNorm weights stored as ``w - 1`` (Gemma), scaled embeddings, gelu-tanh MLPs, attention
scale, attention and final logit soft-capping, sliding-window layers, partial rotary and
per-layer-type rotary tables. The native library's layer takes every one of them
(``native/decoder.py``).

The model never sees requests: it gets a ``ForwardBatch`` of flattened new tokens, writes
their K/V into the pool through the attention backend, and returns logits only for
``batch.logits_indices`` (the last position of each request, plus prompt positions whose
logprobs were asked for). Fused ops come from one dispatch point (``radixlm.kernels``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels.dispatch import get_ops
from radixlm.kernels.ref import softcap
from radixlm.runtime.forward_batch import ForwardBatch
from radixlm.runtime.models.invariant import act_and_mul
from radixlm.runtime.models.quant import Linear, pack_int4, quantize_int4, quantize_int8
from radixlm.runtime.models.rope import layer_ropes
from radixlm.runtime.models.rope import rope_inv_freq as rope_inv_freq  # re-export
from radixlm.runtime.models.shape import FULL, ModelConfig


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


def _names(w: dict, fused: str, parts: list[str]) -> list[str]:
    """The checkpoint's names for a fused projection: Phi-3 stores ``qkv_proj`` and
    ``gate_up_proj`` already fused, the others their parts."""
    return [fused] if fused + ".weight" in w else parts


class LlamaLayer:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], layer_id: int,
                 int4: dict | None = None) -> None:
        self.cfg, self.layer_id = cfg, layer_id
        self.rope_key = cfg.layer_types[layer_id] if cfg.layer_types else FULL
        self.input_norm = w["input_layernorm.weight"]
        # Gemma: post_attention_layernorm normalizes the attention output; the pre-MLP norm
        # (which Llama calls post_attention_layernorm) is pre_feedforward_layernorm.
        self.attn_out_norm = w["post_attention_layernorm.weight"] if cfg.sandwich_norm else None
        self.post_norm = w["pre_feedforward_layernorm.weight" if cfg.sandwich_norm
                           else "post_attention_layernorm.weight"]
        self.mlp_out_norm = w["post_feedforward_layernorm.weight"] if cfg.sandwich_norm else None
        self.q_norm = w["self_attn.q_norm.weight"] if cfg.qk_norm else None
        self.k_norm = w["self_attn.k_norm.weight"] if cfg.qk_norm else None
        qkv_bias = (
            torch.cat([w["self_attn.q_proj.bias"], w["self_attn.k_proj.bias"],
                       w["self_attn.v_proj.bias"]])
            if cfg.qkv_bias and "self_attn.q_proj.bias" in w else None
        )
        self.qkv = _fused_linear(w, _names(w, "self_attn.qkv_proj", [
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]), qkv_bias, int4)
        self.o_proj = _fused_linear(w, ["self_attn.o_proj"], None, int4)
        self.gate_up = _fused_linear(w, _names(w, "mlp.gate_up_proj", [
            "mlp.gate_proj", "mlp.up_proj"]), None, int4)
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
        if self.q_norm is not None:
            q = ops.rmsnorm(q, self.q_norm, cfg.rms_norm_eps)
            k = ops.rmsnorm(k, self.k_norm, cfg.rms_norm_eps)
        q, k = self._rotary(q, k, cos, sin, ops)
        o = attn.forward(q, k, v, self.layer_id, batch)  # (T, H, D)
        h = self.o_proj(o.reshape(-1, cfg.q_size))
        if self.all_reduce is not None:  # tensor parallel: sum the row-parallel partials
            h = self.all_reduce(h)
        if self.attn_out_norm is not None:
            h = ops.rmsnorm(h, self.attn_out_norm, cfg.rms_norm_eps)
        x, residual = ops.rmsnorm(h, self.post_norm, cfg.rms_norm_eps, residual)
        gate_up = self.gate_up(x)
        if self.gate_up.fixed_rows:  # (batch-invariant: the activation a row a call)
            h = self.down(act_and_mul(cfg.act, gate_up))
        else:
            h = self.down(ops.silu_and_mul(gate_up) if cfg.act == "silu"
                          else ops.gelu_tanh_and_mul(gate_up))
        if self.all_reduce is not None:
            h = self.all_reduce(h)
        if self.mlp_out_norm is not None:
            h = ops.rmsnorm(h, self.mlp_out_norm, cfg.rms_norm_eps)
        return h, residual

    def _rotary(self, q, k, cos, sin, ops):
        dim = 2 * cos.shape[-1]
        if dim == self.cfg.head_dim:
            return ops.apply_rotary(q, k, cos, sin)
        q_rot, k_rot = ops.apply_rotary(q[..., :dim], k[..., :dim], cos, sin)  # partial
        return torch.cat([q_rot, q[..., dim:]], -1), torch.cat([k_rot, k[..., dim:]], -1)


class LlamaModel:
    """Weights as plain tensors (no nn.Module bookkeeping in the hot path)."""

    def __init__(self, hf_config, state: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, int4: dict | None = None, tp=None,
                 batch_invariant: bool = False) -> None:
        """``int4``: None for plain weights; else HF name -> (q, scale, zero) of exact
        source blocks (missing names are quantized from the weights). ``tp``: None, or the
        rank's ``TPGroup`` when ``hf_config``/``state`` describe one tensor-parallel shard
        (see radixlm/runtime/parallel/sharding.py). ``batch_invariant``: every linear in
        calls of one shape (``Linear.fixed_rows``) and the MLP's activation one row a call
        (``invariant.act_and_mul``), so a row's numbers do not depend on its step (norms,
        rotary and the logits' soft-cap are per element or per row already)."""
        self.hf_config = hf_config
        self.tp = tp
        self.cfg = cfg = ModelConfig.from_hf(hf_config)
        self.dtype, self.device = dtype, device
        self.ops = get_ops(device)

        def get(name: str) -> torch.Tensor:
            if name not in state:
                raise ValueError(f"weight {name!r} missing from checkpoint")
            t = state[name]
            if cfg.norm_offset and name.endswith("norm.weight"):
                t = t.float() + cfg.norm_offset  # in fp32, like the reference
            return t.to(device=device, dtype=dtype).contiguous()

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
        self.ropes = layer_ropes(hf_config, device, {layer.rope_key for layer in self.layers})
        # With weight-only decode linears, the head (a third of a batch-1 step) gets int8
        # channels too (its GGUF source is Q8_0, blocks of 32: ~1% logit error vs bf16).
        self.head = Linear(self.lm_head, None,
                           int8=quantize_int8(self.lm_head) if int4 is not None else None)
        for linear in [self.head] + [getattr(layer, name) for layer in self.layers
                                     for name in ("qkv", "o_proj", "gate_up", "down")]:
            linear.fixed_rows = batch_invariant

    @property
    def vocab_size(self) -> int:
        return self.tp.vocab_size if self.tp is not None else int(self.lm_head.shape[0])

    def native_unsupported(self) -> str | None:
        """Why the native CPU decoder cannot run this model beyond ``decoder.supported``'s
        checks: None (its layer takes every family switch)."""
        return None

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), V]`` in fp32 (and ``batch.hidden``)."""
        ops, cfg = self.ops, self.cfg
        if self.tp is not None:  # vocab-parallel
            h = self.tp.embed(batch.input_ids, self.embed)  # (T, hidden)
        else:
            h = F.embedding(batch.input_ids, self.embed)  # (T, hidden)
        if cfg.embed_scale != 1.0:
            h = h * torch.tensor(cfg.embed_scale, dtype=h.dtype)
        rope = {t: r.cos_sin(ops, batch.positions, self.dtype) for t, r in self.ropes.items()}
        residual = None
        for layer in self.layers:
            cos, sin = rope[layer.rope_key]
            h, residual = layer.forward(h, residual, cos, sin, attn, batch, ops)
        if batch.hidden_indices is not None:  # encode requests' rows, before the final norm
            idx = batch.hidden_indices
            batch.hidden = h[idx].float() + residual[idx].float()
        h = h[batch.logits_indices]
        residual = residual[batch.logits_indices]
        h, _ = ops.rmsnorm(h, self.norm, cfg.rms_norm_eps, residual)
        logits = self.head(h)
        if self.tp is not None:  # vocab-parallel: each rank has a block of columns
            logits = self.tp.gather_logits(logits)
        logits = logits.float()
        if cfg.final_softcap is not None:
            logits = softcap(logits, cfg.final_softcap)
        return logits
