"""The decoder's shape and family switches (``ModelConfig``), read from a transformers
config, and what follows from them alone: the rotary parameters' place in the config and
the native path's family check (``native_unsupported``), a token's K/V bytes
(``kv_bytes_per_token``). No torch here: a start reads these before torch is imported
(``runtime/early.py``)."""

from __future__ import annotations

from dataclasses import dataclass


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


SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape and family switches, read from a transformers config."""

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
    model_type: str = "llama"
    # Family switches (defaults = plain Llama).
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): Gemma stores w - 1
    qk_norm: bool = False  # RMSNorm over head_dim of q and k before rotary (Qwen3, Gemma 3)
    sandwich_norm: bool = False  # norms after attention and MLP too (Gemma 2/3)
    act: str = "silu"  # MLP gate activation: silu | gelu_tanh
    embed_scale: float = 1.0  # embeddings times this (Gemma: sqrt(hidden))
    attn_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar)
    attn_softcap: float | None = None  # tanh soft-capping of attention scores (Gemma 2)
    final_softcap: float | None = None  # tanh soft-capping of the logits (Gemma 2)
    sliding_window: int | None = None  # keys within this many positions, on sliding layers
    layer_types: tuple[str, ...] = ()  # per layer FULL | SLIDING; () = all FULL
    rotary_dim: int | None = None  # rotated leading dims of a head (None: all; Phi-3.5/4)

    @classmethod
    def from_hf(cls, cfg) -> ModelConfig:
        mt = cfg.model_type
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {mt!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        act_name = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
        if act_name not in _ACTIVATIONS:
            raise ValueError(f"activation {act_name!r} of {mt!r} is not supported")
        gemma = mt.startswith("gemma")
        window = getattr(cfg, "sliding_window", None)
        types = tuple(getattr(cfg, "layer_types", None) or ())
        if window is None or not types:  # Mistral, Phi-3: one window on every layer
            types = (SLIDING if window else FULL,) * cfg.num_hidden_layers
        if len(types) != cfg.num_hidden_layers or not set(types) <= {FULL, SLIDING}:
            raise ValueError(f"layer_types {types!r} are not supported")
        scalar = getattr(cfg, "query_pre_attn_scalar", None)
        partial = rope_params(cfg).get("partial_rotary_factor",
                                       getattr(cfg, "partial_rotary_factor", 1.0))
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
            qkv_bias=mt == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            model_type=mt,
            norm_offset=1.0 if gemma else 0.0,
            qk_norm=mt in ("qwen3", "gemma3_text"),
            sandwich_norm=gemma,
            act=_ACTIVATIONS[act_name],
            embed_scale=cfg.hidden_size**0.5 if gemma else 1.0,
            attn_scale=None if scalar is None else scalar**-0.5,
            attn_softcap=getattr(cfg, "attn_logit_softcapping", None),
            final_softcap=getattr(cfg, "final_logit_softcapping", None),
            sliding_window=window if SLIDING in types else None,
            layer_types=() if SLIDING not in types else types,
            rotary_dim=None if partial == 1.0 else int(head_dim * partial),
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def window(self, layer_id: int) -> int | None:
        """The sliding window of layer ``layer_id`` (None: full attention)."""
        if self.layer_types and self.layer_types[layer_id] == SLIDING:
            return self.sliding_window
        return None

    def attn_options(self) -> list:
        """What the attention backend needs per layer (scale, soft-cap, window)."""
        from radixlm.runtime.attention.base import AttnLayerOptions

        scale = self.head_dim**-0.5 if self.attn_scale is None else self.attn_scale
        return [AttnLayerOptions(scale, self.attn_softcap, self.window(i))
                for i in range(self.num_layers)]


def native_unsupported(hf_config) -> str | None:
    """Why a GGUF of this config cannot run on the native path alone (None: it can): its
    layer takes every family switch; the matrices' dimensions must be multiples of 32."""
    cfg = ModelConfig.from_hf(hf_config)
    if cfg.hidden_size % 32 or cfg.intermediate_size % 32 or cfg.q_size % 32:
        return "dimensions not multiples of 32"
    return None


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype,
                       kv_cache_dtype: str = "auto") -> int:
    """Bytes of one token's K/V (all layers) in the format ``kv_cache_dtype``; ``dtype``
    (the model's: a torch dtype or its name) for the plain format."""
    if kv_cache_dtype == "int8":
        return 2 * num_layers * num_kv_heads * (head_dim + 2)  # int8 values, bf16 scale
    return 2 * num_layers * num_kv_heads * head_dim * _DTYPE_BYTES[
        str(dtype).removeprefix("torch.")]
