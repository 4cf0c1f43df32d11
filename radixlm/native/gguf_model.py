"""Everything the engine needs from a GGUF besides its tensors' math: the architecture, a
transformers config, the tokenizer with its chat template, the end-of-turn ids, and the
tensors (maps of the file) checked against the shapes the config implies.

All of it comes from one walk of the file's header (``read_gguf``): no dequantization, no
cache directory. The config dict is built as transformers' GGUF loader builds it
(``load_gguf_checkpoint``: its key renames, its tie and vocabulary rules), then given what
that loader leaves out (head_dim, soft-caps, windows, partial rotary and the rope scaling
llama.cpp wrote). The tokenizer is transformers' own GGUF tokenizer builder run on the
metadata this walk read (a byte-level vocabulary's backend built the same way in
``gguf_tokenizer``, without importing transformers' model packages), so it equals
``AutoTokenizer.from_pretrained(dir, gguf_file=...)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radixlm.native.file_config import FAMILIES, GGUF_RENAMES, FileConfig
from radixlm.native.file_tokenizer import FileTokenizer, transformers_setup
from radixlm.native.gguf_file import GGUFTensor, read_gguf
from radixlm.native.gguf_tokenizer import RENAMES, byte_level_backend

# general.architecture -> transformers model_type (what radixlm's Llama-family model runs)
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                 "gemma3": "gemma3_text", "phi3": "phi3"}
FULL, SLIDING = "full_attention", "sliding_attention"
_TOKENIZER_KEYS = ("model", "pre", "tokens", "scores", "token_type", "merges",
                   "precompiled_charsmap", "bos_token_id", "eos_token_id", "unknown_token_id",
                   "padding_token_id", "eot_token_id", "eom_token_id", "add_space_prefix",
                   "add_bos_token", "add_eos_token")
# config types whose tokenizer is transformers' TokenizersBackend on the file's backend:
# Llama's (transformers maps LlamaConfig to no class), and Qwen 2 / 3's, whose class
# (Qwen2Tokenizer) builds a backend that the file's replaces and adds nothing else once the
# file's special tokens are given (tests/test_gguf_model.py compares every behaviour);
# looking that class up would import transformers.models (0.3-0.55 s on 2 cores: the first
# such import walks all ~570 model folders), on the start's critical path
_PLAIN_BACKEND = frozenset(("llama", "qwen2", "qwen3"))
_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                   "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
# {arch}.* keys read besides transformers' renames: the fixups' and the rope scaling's
_ARCH_KEYS = ("attention.key_length", "attention.sliding_window",
              "attention.sliding_window_pattern", "attn_logit_softcapping",
              "final_logit_softcapping", "rope.dimension_count", "rope.freq_base",
              "rope.freq_base_swa", "rope.scale_linear", "rope.scaling.type",
              "rope.scaling.factor", "rope.scaling.original_context_length",
              "rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier",
              "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow")


@dataclass(frozen=True)
class GGUFModelInfo:
    """A GGUF model as the engine loads it.

    ``config`` is transformers' config (a ``FileConfig`` of its values for Llama and Qwen,
    transformers' own class for the others) for ``ModelConfig.from_hf`` and the rotary
    tables; ``tokenizer`` (built on first use, ``new_tokenizer``) a transformers fast
    tokenizer carrying the file's chat template; ``eos_token_ids`` the ids a turn ends with
    (EOS, then end-of-turn and end-of-message where the file names them); ``tensors`` the
    file's tensors in file order, mapped (not read), every one the architecture needs
    present at the shape the config implies; ``weights_bytes`` their total size."""

    path: Path
    architecture: str  # general.architecture
    config: object  # FileConfig | transformers.PretrainedConfig
    eos_token_ids: tuple[int, ...]
    tensors: tuple[GGUFTensor, ...]
    weights_bytes: int
    metadata: dict  # the keys read: general.*, tokenizer.*, the architecture's

    @property
    def model_type(self) -> str:
        return self.config.model_type

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template

    @functools.cached_property
    def tokenizer(self):
        """The file's tokenizer, built on first use and shared (``new_tokenizer``: one to
        edit)."""
        return self.new_tokenizer()

    def new_backend(self):
        """The vocabulary's ``tokenizers`` backend where radixlm builds it (a byte-level one,
        ``gguf_tokenizer.byte_level_backend``: no transformers imported, ~0.2 s for 49k
        tokens), else None (transformers' converter builds it in ``new_tokenizer``).
        ``ValueError`` names a merge that is not two tokens of the vocabulary making a
        third: the engine builds this before its runner allocates anything."""
        tokenizer_dict, _ = _tokenizer_inputs(self.metadata, self.path)
        if tokenizer_dict.get("tokenizer_type") != "gpt2" or "merges" not in tokenizer_dict:
            return None
        try:
            return byte_level_backend(tokenizer_dict)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from exc

    def new_tokenizer(self, backend=None):
        """A transformers tokenizer of the caller's own, on ``backend`` (``new_backend``'s,
        handed over; built here if None). ``TokenizersBackend`` deep-copies the
        ``tokenizer_object`` it is given (as long again as the build): it gets this one as
        its own copy (``_Handover``)."""
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        cls, backend, kwargs = _tokenizer_parts(self.metadata, self.architecture, self.config,
                                                self.path, backend or self.new_backend())
        given = _Handover(backend) if cls is TokenizersBackend else backend
        return cls(tokenizer_object=given, added_tokens_decoder={}, **kwargs)

    def start_tokenizer(self, backend=None):
        """The engine's tokenizer: where the vocabulary is byte-level and transformers' class
        for it ``TokenizersBackend`` (``_PLAIN_BACKEND``), a ``FileTokenizer`` on ``backend``
        (``new_backend``'s, handed over): transformers is imported when a call needs it,
        not at the start (``file_tokenizer.py`` says why); else ``new_tokenizer``'s."""
        backend = backend or self.new_backend()
        if backend is None or self.config.model_type not in _PLAIN_BACKEND:
            return self.new_tokenizer(backend)
        _, tokenizer_config = _tokenizer_inputs(self.metadata, self.path)
        transformers_setup(backend, tokenizer_config)
        return FileTokenizer(backend, tokenizer_config, self.new_tokenizer)

    @classmethod
    def from_path(cls, path: str | Path) -> GGUFModelInfo:
        """Read the GGUF at ``path``; ``ValueError`` names a damaged file, an unsupported
        architecture, or a tensor missing or at the wrong shape."""
        path = Path(path)
        meta, tensors = read_gguf(path, _wanted_keys())
        arch = meta.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")
        by_name = {t.name: t for t in tensors}
        try:
            config = _config(meta, arch, by_name)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        _check_tensors(path, config, arch, by_name)
        n_tokens = _check_tokenizer(meta, path)
        if n_tokens != config.vocab_size:  # (added tokens beyond the list may be more)
            raise ValueError(f"{path}: the tokenizer has {n_tokens} tokens but "
                             f"token_embd.weight has {config.vocab_size} rows")
        return cls(path, arch, config, _eos_ids(meta), tuple(tensors),
                   sum(t.data.nbytes for t in tensors), meta)


def _wanted_keys() -> set[str]:
    keys = {"general.architecture", "general.name", "general.file_type",
            "tokenizer.chat_template"}
    keys |= {f"tokenizer.ggml.{k}" for k in _TOKENIZER_KEYS}
    for arch in ARCHITECTURES:
        keys |= {f"{arch}.{k}" for k in (*GGUF_RENAMES[arch], *_ARCH_KEYS)}
    return keys


def _config(meta: dict, arch: str, tensors: dict[str, GGUFTensor]):
    """The config ``AutoConfig.from_pretrained(dir, gguf_file=...)`` gives, with
    ``_fixups`` and ``_rope_scaling`` applied (Llama's and Qwen's built without importing
    transformers: ``file_config.FileConfig``)."""
    # transformers' rule: a "llama" file is Mistral only where general.name is "mistral"
    updated = "mistral" if arch == "llama" and meta.get("general.name") == "mistral" else arch
    config: dict = {"tie_word_embeddings": "output.weight" not in tensors}
    for key, value in meta.items():
        prefix, _, rest = key.replace(arch, updated).partition(".")
        target = GGUF_RENAMES.get(prefix, {}).get(rest)
        if target is None or target == -1:
            continue
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str) and arch in value:
            value = value.replace(arch, updated)
        config[target] = value
    if config.get("model_type") == "gemma3":
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in meta:
        config["vocab_size"] = len(meta["tokenizer.ggml.tokens"])
    model_type = config.pop("model_type")
    if model_type in FAMILIES:
        cfg = FileConfig(model_type, config)
    else:
        from transformers import AutoConfig

        cfg = AutoConfig.for_model(model_type, **config)
    _fixups(cfg, meta, arch, tensors)
    _rope_scaling(cfg, meta, arch, tensors)
    return cfg


def _fixups(config, meta: dict, arch: str, tensors: dict[str, GGUFTensor]) -> None:
    """What transformers' GGUF config reader leaves at a default although the file (or
    llama.cpp's own rules) says otherwise: head_dim, soft-caps, the attention scale, sliding
    windows, partial rotary, Gemma 3's rope scaling and Phi-3's longrope factors. (The same
    rules as ``radixlm.runtime.gguf_config.config_fixups``, on this walk's metadata.)"""

    def field(key: str):
        return meta.get(f"{arch}.{key}")

    mt = config.model_type
    if field("attention.key_length") and mt == "qwen3":
        config.head_dim = int(field("attention.key_length"))
    if mt in ("gemma2", "gemma3_text"):
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if mt == "gemma2" or field(key) is not None:
                setattr(config, key, field(key))
        # llama.cpp: the 27B models scale by (hidden / heads) ** -0.5, the others by head_dim
        big = config.num_hidden_layers == (46 if mt == "gemma2" else 62)
        config.query_pre_attn_scalar = (config.hidden_size // config.num_attention_heads
                                        if big else config.head_dim)
        pattern = field("attention.sliding_window_pattern")
        if mt == "gemma3_text" and pattern is not None:  # an int n (every n-th layer is
            # global), or one bool per layer (true: sliding)
            sliding = ([bool((i + 1) % int(pattern)) for i in range(config.num_hidden_layers)]
                       if isinstance(pattern, int) else [bool(x) for x in pattern])
            config.layer_types = [SLIDING if x else FULL for x in sliding]
        if mt == "gemma3_text" and field("rope.freq_base_swa") is not None:
            config.rope_parameters[SLIDING]["rope_theta"] = float(field("rope.freq_base_swa"))
        if mt == "gemma3_text" and field("rope.scaling.type") == "linear":
            config.rope_parameters[FULL].update(
                rope_type="linear", factor=float(field("rope.scaling.factor")))
    if mt == "phi3":
        window = field("attention.sliding_window")
        config.sliding_window = int(window) if window else None
        rot = field("rope.dimension_count")
        head = config.hidden_size // config.num_attention_heads
        if rot and int(rot) != head:
            config.rope_parameters["partial_rotary_factor"] = int(rot) / head
        factors = {name.split(".")[0]: np.asarray(t.data, dtype=np.float32).tolist()
                   for name, t in tensors.items() if name.startswith("rope_factors_")}
        if factors:
            orig = field("rope.scaling.original_context_length")
            if orig is None or set(factors) != {"rope_factors_long", "rope_factors_short"}:
                raise ValueError("Phi-3 longrope needs rope_factors_long, rope_factors_short "
                                 f"and {arch}.rope.scaling.original_context_length")
            orig = int(orig)
            config.original_max_position_embeddings = orig
            config.rope_parameters.update(
                rope_type="longrope", long_factor=factors["rope_factors_long"],
                short_factor=factors["rope_factors_short"],
                original_max_position_embeddings=orig)
            if field("rope.scaling.attn_factor") is not None:
                config.rope_parameters["attention_factor"] = float(
                    field("rope.scaling.attn_factor"))


def _rope_scaling(config, meta: dict, arch: str, tensors: dict[str, GGUFTensor]) -> None:
    """The rope scaling llama.cpp wrote for a Llama / Qwen model, as transformers' rope
    parameters (transformers' GGUF reader drops it): linear and YaRN from the metadata,
    Llama 3's from the ``rope_freqs`` tensor (one divisor per rotated pair)."""
    if config.model_type not in ("llama", "mistral", "qwen2", "qwen3"):
        return  # Gemma 3's and Phi-3's are in _fixups
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor") or meta.get(f"{arch}.rope.scale_linear")
    if kind is None and meta.get(f"{arch}.rope.scale_linear"):
        kind = "linear"
    params = config.rope_parameters
    if kind == "linear" and factor and float(factor) != 1.0:
        params.update(rope_type="linear", factor=float(factor))
    elif kind == "yarn":
        for key in ("rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier"):
            if meta.get(f"{arch}.{key}") is not None:
                raise ValueError(f"YaRN with {arch}.{key} is not supported")
        params.update(rope_type="yarn", factor=float(factor), original_max_position_embeddings=int(
            meta[f"{arch}.rope.scaling.original_context_length"]))
        for key in ("beta_fast", "beta_slow"):
            if meta.get(f"{arch}.rope.scaling.yarn_{key}") is not None:
                params[key] = float(meta[f"{arch}.rope.scaling.yarn_{key}"])
    elif kind not in (None, "none", "linear"):
        raise ValueError(f"rope scaling type {kind!r} of {arch!r} is not supported")
    if "rope_freqs.weight" in tensors:
        params.update(_llama3_rope(config, np.asarray(tensors["rope_freqs.weight"].data,
                                                      dtype=np.float64)))


def _llama3_rope(config, divisors: np.ndarray) -> dict:
    """transformers' "llama3" rope parameters whose frequencies are llama.cpp's base
    frequencies over ``divisors`` (``rope_freqs``); ``ValueError`` if none give them.

    Only ratios matter (the band runs from wavelength ``original / high`` to ``original /
    low``), so in terms of u = low / original and H = high / low: a pair is divided by
    ``factor`` below x = 1 / wavelength = u, by 1 above H u, and in between by the smooth
    ramp s = (x / u - 1) / (H - 1), fitted from the pairs in the band."""
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size
                                                     // config.num_attention_heads)
    inv = 1.0 / config.rope_parameters["rope_theta"] ** (
        np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    if divisors.shape != inv.shape:
        raise ValueError(f"rope_freqs.weight has {divisors.size} values, expected "
                         f"{inv.size} (head_dim {head_dim} / 2)")
    factor = float(divisors.max())
    if factor <= 1 + 1e-6:
        return {}
    x = inv.astype(np.float64) / (2 * np.pi)
    top, one = divisors >= factor * (1 - 1e-6), divisors <= 1 + 1e-6
    band = ~top & ~one
    x_top, x_one = x[top].max(), (x[one].min() if one.any() else np.inf)
    ramp = (1 / divisors[band] - 1 / factor) / (1 - 1 / factor)
    if band.sum() >= 2:
        slope, cut = np.polyfit(x[band], ramp, 1)
        h = 1 - 1 / cut
        u = 1 / (slope * (h - 1))
    elif band.sum() == 1:  # one pair on the ramp: put u between it and the last divided one
        x0, s0 = x[band][0], ramp[0]
        u = np.sqrt(x_top * x0)
        h = 1 + (x0 / u - 1) / s0
        while h * u >= x_one:
            u = np.sqrt(u * x0)
            h = 1 + (x0 / u - 1) / s0
    else:  # no ramp pair: any band between the divided pairs and the others
        u = 2 * x_top if np.isinf(x_one) else x_top ** (2 / 3) * x_one ** (1 / 3)
        h = 4.0 if np.isinf(x_one) else (x_one / x_top) ** (1 / 3)
    nice = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": round(float(h), 4),
            "original_max_position_embeddings": int(round(1 / u))}
    exact = nice | {"low_freq_factor": float(8192 * u), "high_freq_factor": float(8192 * u * h),
                    "original_max_position_embeddings": 8192}
    for params in (nice, exact):
        if np.allclose(_llama3_divisors(inv, params), divisors, rtol=1e-5):
            return params
    raise ValueError(f"rope_freqs.weight matches no llama3 rope scaling (factor {factor})")


def _llama3_divisors(inv: np.ndarray, p: dict) -> np.ndarray:
    """llama.cpp's converter's ``rope_freqs`` for llama3 parameters ``p``."""
    wavelen = 2 * np.pi / inv.astype(np.float64)
    orig, low, high = p["original_max_position_embeddings"], p["low_freq_factor"], \
        p["high_freq_factor"]
    smooth = (orig / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / p["factor"] + smooth)
    return np.where(wavelen < orig / high, 1.0,
                    np.where(wavelen > orig / low, p["factor"], mid))


def _check_tokenizer(meta: dict, path: Path) -> int:
    """The vocabulary's size; ``ValueError`` for a file without one, or a special token id
    outside it (what the tokenizer's making would trip over later)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens (a GGUF without a vocabulary)")
    for key in _SPECIAL_TOKENS.values():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and not 0 <= token_id < len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{key} {token_id} is outside the "
                             f"vocabulary ({len(tokens)} tokens)")
    return len(tokens)


def _tokenizer_inputs(meta: dict, path: Path) -> tuple[dict, dict]:
    """``(tokenizer_dict, tokenizer_config)`` as transformers' ``get_gguf_tokenizer`` reads
    them from the file, from this walk's metadata (``_check_tokenizer`` passed)."""
    _check_tokenizer(meta, path)
    tokens = meta["tokenizer.ggml.tokens"]
    grouped = {group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items()
                       if f"tokenizer.{key}" in meta}
               for group, renames in RENAMES.items()}
    tokenizer_dict, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":  # llama.cpp adds BOS to a
        tokenizer_config.setdefault("add_bos_token", True)  # sentencepiece vocabulary
    for name, key in _SPECIAL_TOKENS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[token_id] if token_id is not None else None
    return tokenizer_dict, tokenizer_config


class _Handover:
    """A backend given to ``TokenizersBackend(tokenizer_object=...)`` as its own: that class
    deep-copies what it is given, and the copy of this is the backend itself."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def __deepcopy__(self, memo):
        return self._backend


def _tokenizer_parts(meta: dict, arch: str, config, path: Path, backend) -> tuple:
    """``(class, backend, keywords)`` of transformers' GGUF tokenizer from this walk's
    metadata: ``backend`` (``GGUFModelInfo.new_backend``'s) or, where that is None, the one
    ``convert_gguf_tokenizer`` builds; the class ``AutoTokenizer`` picks for the config
    (``TokenizersBackend`` for ``_PLAIN_BACKEND``'s), the keywords it is made with
    (``GGUFModelInfo.new_tokenizer``)."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    tokenizer_dict, tokenizer_config = _tokenizer_inputs(meta, path)
    extra = {}
    if backend is None:
        from transformers.integrations.gguf import convert_gguf_tokenizer

        backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    if config.model_type in _PLAIN_BACKEND:
        cls = TokenizersBackend
    else:
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

        hf = config.hf() if isinstance(config, FileConfig) else config
        cls = TOKENIZER_MAPPING.get(type(hf), None) or TokenizersBackend
    return cls, backend, {"name_or_path": str(path), **tokenizer_config, **extra}


def _eos_ids(meta: dict) -> tuple[int, ...]:
    """EOS, then end-of-turn and end-of-message ids where the file names them (what a
    directory's ``generation_config.json`` lists for an instruct model)."""
    ids = (meta.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id",
                                                      "eom_token_id"))
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def _expected_shapes(config, arch: str, tensors: dict) -> tuple[dict, set[str]]:
    """``({name: GGUF dims (row length first)} required, {names allowed besides})``."""
    n_embd, n_ff, n_vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or n_embd // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * head_dim
    need = {"token_embd.weight": (n_embd, n_vocab), "output_norm.weight": (n_embd,)}
    if "output.weight" in tensors:
        need["output.weight"] = (n_embd, n_vocab)
    optional = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
    for i in range(config.num_hidden_layers):
        b = f"blk.{i}."
        layer = {"attn_norm.weight": (n_embd,), "attn_output.weight": (q, n_embd),
                 "ffn_norm.weight": (n_embd,), "ffn_down.weight": (n_ff, n_embd)}
        if arch == "phi3" and b + "attn_qkv.weight" in tensors:  # fused q ‖ k ‖ v
            layer["attn_qkv.weight"] = (n_embd, q + 2 * kv)
        else:
            layer |= {"attn_q.weight": (n_embd, q), "attn_k.weight": (n_embd, kv),
                      "attn_v.weight": (n_embd, kv)}
        if arch == "phi3":  # fused gate ‖ up
            layer["ffn_up.weight"] = (n_embd, 2 * n_ff)
        else:
            layer |= {"ffn_gate.weight": (n_embd, n_ff), "ffn_up.weight": (n_embd, n_ff)}
        if arch == "qwen2":
            layer |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
        if arch in ("qwen3", "gemma3"):
            layer |= {"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)}
        if arch.startswith("gemma"):
            layer |= {"post_attention_norm.weight": (n_embd,),
                      "post_ffw_norm.weight": (n_embd,)}
        need |= {b + k: v for k, v in layer.items()}
    return need, optional


def _dims(t: GGUFTensor) -> tuple[int, ...]:
    """The tensor's GGUF dims (row length first), whatever its type."""
    import gguf

    shape = t.data.shape
    if t.data.dtype == np.uint8:  # blocks (and BF16): one row of bytes per row
        shape = gguf.quant_shape_from_byte_shape(shape, t.tensor_type)
    return tuple(int(d) for d in reversed(shape))


def _check_tensors(path: Path, config, arch: str, tensors: dict[str, GGUFTensor]) -> None:
    """Every tensor ``arch`` needs is there at the shape the config implies, and no other."""
    need, optional = _expected_shapes(config, arch, tensors)
    for name, dims in need.items():
        if name not in tensors:
            raise ValueError(f"{path}: tensor {name} is missing (a {arch} model with "
                             f"{config.num_hidden_layers} layers needs it)")
        found = _dims(tensors[name])
        if found != dims:
            raise ValueError(f"{path}: tensor {name} has shape {list(found)}, expected "
                             f"{list(dims)} (GGUF order, row length first) from the config")
    extra = sorted(set(tensors) - set(need) - optional)
    if extra:
        raise ValueError(f"{path}: tensor {extra[0]} is not one a {arch} model with "
                         f"{config.num_hidden_layers} layers has ({len(extra)} such)")
