"""transformers' ``LlamaConfig``, declared here so that a Llama GGUF's config costs no import.

transformers' own module imports ``utils.type_validators`` (for one ``interval``), which
imports ``activations`` -> ``integrations.hub_kernels`` -> ``core_model_loading`` ->
``torch.distributed.tensor``: ~0.8 s of every engine start for a config object. This class
has transformers' fields, defaults, validation and ``__post_init__`` word for word, on the
same base (``PreTrainedConfig``, whose module is light), and the same name and
``model_type``, so transformers' auto mappings, rope functions and ``save_pretrained``
treat it as theirs. ``tests/test_gguf_model.py`` checks it against transformers' class
(fields, defaults, class attributes, and the configs both build from the same files).
The other families' config modules import nothing heavy and stay transformers' own.
"""

# (no ``from __future__ import annotations``: strict validation reads these types as
# transformers' module declares them)
from huggingface_hub.dataclasses import as_validated_field, strict
from transformers.configuration_utils import PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters


@as_validated_field
def _unit_interval(value: int | float):
    """transformers' ``interval(min=0.0, max=1.0)``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Value must be greater or equal to 0.0 and smaller or equal to 1.0, "
                         f"got {value}.")


@strict
class LlamaConfig(PreTrainedConfig):
    model_type = "llama"
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = _unit_interval(default=0.02)
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pretraining_tp: int | None = 1
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False
    attention_dropout: int | float | None = 0.0
    mlp_bias: bool = False
    head_dim: int | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads

        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Part of `@strict`-powered validation. Validates the architecture of the config."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"The hidden size ({self.hidden_size}) is not a multiple of the number of "
                f"attention heads ({self.num_attention_heads})."
            )
