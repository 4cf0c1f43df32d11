"""A GGUF's config as transformers would build it, without importing transformers.

``import transformers`` walks the source of every model package the library has (~0.6 s of a
2-core host's start), and a config class of its own pulls more (Llama's: ``activations`` ->
``torch.distributed.tensor``, ~0.8 s). For the families whose config is plain data
(``FAMILIES``: Llama, Qwen 2 / 3, Gemma 2 / 3, Phi-3) ``FileConfig`` holds exactly the
fields transformers' class holds, with the same values: the class's defaults (``_BASE`` and
``_FAMILY``, compared with transformers' classes in ``tests/test_gguf_model.py``), the
file's values over them, and what the class's ``__post_init__`` derives (head_dim, the KV
heads, layer types, the rope dict: one per layer type for Gemma 3). Read as attributes,
``to_dict`` and ``copy.deepcopy`` as transformers' own. What needs transformers' object
itself (a rope function past default / linear / llama3, ``save_pretrained``, the tokenizer
class a config maps to) calls ``hf()``: transformers' config built from these values,
imported then.

``GGUF_RENAMES`` is transformers' GGUF reader's key table (``GGUF_CONFIG_MAPPING``) for the
architectures radixlm runs, held here for the same reason (compared in the tests).
"""

from __future__ import annotations

import copy

_COMMON = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
           "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
           "rope.dimension_count": None, "rope.freq_base": "rope_theta",
           "attention.head_count": "num_attention_heads",
           "attention.head_count_kv": "num_key_value_heads",
           "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size"}
_GEMMA = _COMMON | {"attention.key_length": "head_dim",
                    "attention.sliding_window": "sliding_window"}
GGUF_RENAMES = {"llama": _COMMON | {"rope.dimension_count": "head_dim"},
                "mistral": _COMMON | {"rope.dimension_count": "head_dim"},
                "qwen2": _COMMON, "qwen3": _COMMON, "gemma2": _GEMMA, "gemma3": _GEMMA,
                "phi3": _COMMON,
                "general": {"architecture": "model_type", "name": "_model_name_or_path"},
                "tokenizer": {"ggml.bos_token_id": "bos_token_id",
                              "ggml.eos_token_id": "eos_token_id",
                              "ggml.unknown_token_id": "unk_token_id",
                              "ggml.padding_token_id": "pad_token_id"}}

# PreTrainedConfig's fields, as its to_dict writes them (transformers_version aside)
_BASE = {"architectures": None, "output_hidden_states": False, "return_dict": True,
         "dtype": None, "chunk_size_feed_forward": 0, "is_encoder_decoder": False,
         "id2label": {0: "LABEL_0", 1: "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
         "problem_type": None, "_name_or_path": "", "output_attentions": False}
_LLM = {"hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-06,
        "use_cache": True, "tie_word_embeddings": False, "rope_parameters": None,
        "attention_dropout": 0.0, "pad_token_id": None, "num_key_value_heads": None}
_QWEN = _LLM | {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                "max_position_embeddings": 32768, "use_sliding_window": False,
                "sliding_window": 4096, "max_window_layers": 28, "layer_types": None,
                "bos_token_id": None, "eos_token_id": None}
_GEMMA_FIELDS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                 "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                 "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                 "max_position_embeddings": 131072, "initializer_range": 0.02,
                 "rms_norm_eps": 1e-06, "use_cache": True, "pad_token_id": 0,
                 "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
                 "rope_parameters": None, "attention_bias": False, "attention_dropout": 0.0,
                 "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None,
                 "final_logit_softcapping": None, "attn_logit_softcapping": None,
                 "use_bidirectional_attention": False}
# each family's own fields and defaults (transformers' dataclass fields)
_FAMILY = {
    "llama": _LLM | {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                     "num_hidden_layers": 32, "num_attention_heads": 32,
                     "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2,
                     "pretraining_tp": 1, "attention_bias": False, "mlp_bias": False,
                     "head_dim": None},
    "qwen2": _QWEN,
    "qwen3": _QWEN | {"head_dim": 128, "attention_bias": False},
    "gemma3_text": _GEMMA_FIELDS,
    "gemma2": _GEMMA_FIELDS | {"vocab_size": 256000, "max_position_embeddings": 8192,
                               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
                               "use_bidirectional_attention": None},
    "phi3": {"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
             "hidden_act": "silu", "max_position_embeddings": 4096,
             "original_max_position_embeddings": 4096, "initializer_range": 0.02,
             "rms_norm_eps": 1e-05, "use_cache": True, "tie_word_embeddings": False,
             "rope_parameters": None, "bos_token_id": 1, "eos_token_id": 32000,
             "pad_token_id": 32000, "sliding_window": None},
}
# rope_theta where the values give none (Gemma 3: its global layers'; its local ones 1e4)
_FAMILY_THETA = {"gemma3_text": 1000000.0}
_LOCAL_THETA = 10000.0
FAMILIES = frozenset(_FAMILY)
_COUNTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads")
_DEFAULT_THETA = 10000.0
_NUMBERS = (int, float)


class FileConfig:
    """transformers' config of ``model_type`` (one of ``FAMILIES``) from ``values`` (what
    the GGUF reader passes its class: fields, ``rope_theta``, and keys the class keeps as
    they are, such as ``unk_token_id``), built as that class builds it.
    ``ValueError`` names a value of the wrong kind or a shape the class refuses."""

    def __init__(self, model_type: str, values: dict) -> None:
        fields = _FAMILY[model_type]
        values = dict(values)
        theta = values.pop("rope_theta", _FAMILY_THETA.get(model_type, _DEFAULT_THETA))
        for key, value in values.items():  # (others are kept as given, as the class keeps
            if key in fields:  # them: e.g. the GGUF reader's unk_token_id)
                _check_kind(key, value, fields[key])
        if not isinstance(theta, _NUMBERS) or isinstance(theta, bool):
            raise ValueError(f"rope_theta is {theta!r}, not a number")
        self.__dict__.update(copy.deepcopy(_BASE) | copy.deepcopy(fields) | values)
        self.model_type = model_type
        self._derive(theta)

    def _derive(self, theta) -> None:
        """The class's ``__post_init__``: derived fields and its shape check."""
        for key in _COUNTS:
            if getattr(self, key) <= 0:
                raise ValueError(f"config field {key} is {getattr(self, key)}, not positive")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        elif self.num_key_value_heads <= 0:
            raise ValueError(f"config field num_key_value_heads is "
                             f"{self.num_key_value_heads}, not positive")
        mt = self.model_type
        if mt in ("llama", "gemma2", "gemma3_text"):
            if self.hidden_size % self.num_attention_heads != 0:
                raise ValueError(f"The hidden size ({self.hidden_size}) is not a multiple of "
                                 f"the number of attention heads ({self.num_attention_heads}).")
        if mt == "llama" and self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        elif mt in ("qwen2", "qwen3"):
            self.sliding_window = self.sliding_window if self.use_sliding_window else None
            if self.layer_types is None:
                self.layer_types = [
                    "sliding_attention" if self.sliding_window is not None
                    and i >= self.max_window_layers else "full_attention"
                    for i in range(self.num_hidden_layers)]
        elif mt in ("gemma2", "gemma3_text"):  # every 2nd / 6th layer global
            every = 2 if mt == "gemma2" else 6
            if mt == "gemma3_text":
                self._sliding_window_pattern = every
            if self.layer_types is None:
                self.layer_types = ["sliding_attention" if (i + 1) % every else "full_attention"
                                    for i in range(self.num_hidden_layers)]
        if mt == "gemma3_text":  # one rope dict per layer type
            params = self.rope_parameters if self.rope_parameters is not None else {}
            for kind, base in (("full_attention", theta), ("sliding_attention", _LOCAL_THETA)):
                params.setdefault(kind, {"rope_type": "default"}).setdefault("rope_theta", base)
            self.rope_parameters = params
            return
        params = self.rope_parameters if self.rope_parameters is not None else {}
        params.setdefault("rope_theta", theta)
        if mt == "phi3":
            params.setdefault("partial_rotary_factor", 1.0)
        params.setdefault("rope_type", params.get("type", "default"))
        self.rope_parameters = params

    def to_dict(self) -> dict:
        """transformers' ``to_dict`` of the same config, less ``transformers_version``."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if k != "_hf"}

    def hf(self):
        """transformers' own config of these values (built on first call; an edit of this
        object after it is not carried over)."""
        if self.__dict__.get("_hf") is None:
            from transformers import AutoConfig

            values = self.to_dict()
            values.pop("model_type")
            self.__dict__["_hf"] = AutoConfig.for_model(self.model_type, **values)
        return self.__dict__["_hf"]

    def __deepcopy__(self, memo):
        new = object.__new__(type(self))
        new.__dict__.update(copy.deepcopy(self.to_dict(), memo))
        return new

    def __repr__(self) -> str:
        return f"FileConfig({self.model_type!r}, {self.to_dict()!r})"


def _check_kind(key: str, value, default) -> None:
    """``value`` is of the kind of its field's default (ints for counts, numbers for the
    rest of the numeric fields, booleans for switches); ``ValueError`` names it."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int) or key in ("head_dim", "num_key_value_heads"):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            value is None and default is None)
    elif isinstance(default, float):
        ok = isinstance(value, _NUMBERS) and not isinstance(value, bool)
    else:
        ok = True
    if not ok:
        raise ValueError(f"config field {key} is {value!r}, not the kind its field takes")
