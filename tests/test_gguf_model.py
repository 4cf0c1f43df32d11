"""A GGUF read as a GGUF (``GGUFModelInfo``) against transformers' own GGUF path: the config
(``AutoConfig.from_pretrained(dir, gguf_file=...)`` + radixlm's fixups) equal field for field
and as ``ModelConfig.from_hf`` reads it; the tokenizer (``AutoTokenizer.from_pretrained``)
equal in its whole serialization, its ids on a set of strings, special ids and chat
template. On the embedded model and on small files written here with gguf's GGUFWriter
(llama, qwen2, qwen3, gemma2, gemma3, phi3; tied and untied; byte-level and sentencepiece
vocabularies). Rope scaling transformers' GGUF reader drops (linear, YaRN, Llama 3's
``rope_freqs``) is checked against transformers' rope functions and llama.cpp's definition.
Tensors missing or at the wrong shape, and hostile headers (each written here by damaging a
real header), are ValueErrors that name the problem, without a large allocation."""

from __future__ import annotations

import copy
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from radixlm.native.file_config import FAMILIES, FileConfig
from radixlm.native.gguf_file import read_gguf
from radixlm.native.gguf_model import GGUFModelInfo
from radixlm.runtime.gguf_config import config_fixups
from radixlm.runtime.gguf_load import gguf_hf_config, gguf_tokenizer
from radixlm.runtime.weights import alias_paths

EMBEDDED = alias_paths()["smollm2-135m-instruct"]
TEXTS = ["Hello world", " leading space", "  two  spaces\n\nnew lines\t tab ",
         "unicode: héllo wörld — ✓ 你好 🙂", "<|im_start|>user\nhi<|im_end|>\n",
         "", "end <|endoftext|> mid", "1234567 numbers 3.14", "can't won't I'M", "<s> </s>"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


# ---- reference and comparison ------------------------------------------------------------
def _reference(path: Path):
    """What today's path gives: transformers' GGUF config + radixlm's fixups, and
    transformers' GGUF tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    config_fixups(config, path)
    return config, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _same_config(ours, theirs, rope_differs: bool = False) -> None:
    from radixlm.runtime.models.shape import ModelConfig

    a, b = ours.to_dict(), theirs.to_dict()
    skip = {"_name_or_path", "transformers_version"} | (
        {"rope_parameters"} if rope_differs else set())
    if ours.model_type in FAMILIES:  # transformers' values, without importing transformers
        assert type(ours) is FileConfig
        assert type(ours.hf()) is type(theirs)
        hf = ours.hf().to_dict()
        assert {k: v for k, v in hf.items() if k != "transformers_version"} == a
        for key in set(a) - skip:
            assert getattr(ours, key) == getattr(theirs, key), key
    else:
        assert type(ours) is type(theirs)
    assert {k: v for k, v in a.items() if k not in skip} == \
        {k: v for k, v in b.items() if k not in skip}
    assert ModelConfig.from_hf(ours) == ModelConfig.from_hf(theirs)


def _same_tokenizer(ours, theirs) -> None:
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    # Qwen 2 / 3 files get transformers' plain class where AutoTokenizer picks Qwen2Tokenizer
    # (gguf_model._PLAIN_BACKEND): everything that class could change is compared below
    assert type(ours) is type(theirs) or (type(ours) is TokenizersBackend
                                          and type(theirs).__name__ == "Qwen2Tokenizer")
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert len(ours) == len(theirs)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                 "chat_template", "add_bos_token", "add_eos_token", "all_special_ids",
                 "all_special_tokens", "special_tokens_map", "model_input_names",
                 "padding_side", "truncation_side", "clean_up_tokenization_spaces",
                 "model_max_length", "vocab_size"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert {i: str(t) for i, t in ours.added_tokens_decoder.items()} == \
        {i: str(t) for i, t in theirs.added_tokens_decoder.items()}
    for text in TEXTS:
        assert dict(ours(text)) == dict(theirs(text)), text
        assert ours.tokenize(text) == theirs.tokenize(text), text
        ids = ours(text).input_ids
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                theirs.decode(ids, skip_special_tokens=skip), text
    if theirs.chat_template:
        assert (ours.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
                == theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))


# ---- small files -------------------------------------------------------------------------
_EMBEDDED_VOCAB: dict = {}


def _byte_vocab(n: int = 1200) -> tuple[list[str], list[int], list[str], str]:
    """The embedded model's first ``n`` tokens, the merges among them, its chat template."""
    if not _EMBEDDED_VOCAB:
        keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                "tokenizer.chat_template")
        _EMBEDDED_VOCAB.update(read_gguf(EMBEDDED, keys)[0])
    tokens = _EMBEDDED_VOCAB["tokenizer.ggml.tokens"][:n]
    have = set(tokens)
    merges = [m for m in _EMBEDDED_VOCAB["tokenizer.ggml.merges"]
              if m.replace(" ", "") in have and all(p in have for p in m.split(" "))]
    return (tokens, _EMBEDDED_VOCAB["tokenizer.ggml.token_type"][:n], merges,
            _EMBEDDED_VOCAB["tokenizer.chat_template"])


def _add_byte_tokenizer(w, pre: str) -> int:
    tokens, types, merges, template = _byte_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(template)
    return len(tokens)


_SPECIALS = {"llama": ["<unk>", "<s>", "</s>"],  # unk, bos, eos (then pad where given)
             "gemma": ["<unk>", "<bos>", "<eos>", "<pad>", "<mask>", "<start_of_turn>",
                       "<end_of_turn>"]}


def _add_spm_tokenizer(w, specials: str = "llama") -> int:
    """A sentencepiece ("llama") vocabulary: specials, 256 byte tokens, scored pieces."""
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyzHIM'", "▁t", "he", "▁the", "▁a", "in", "er",
              "▁w", "or", "ld", "▁wor", "▁world", "ll", "▁he", "▁hell", "▁hello", "▁s", "pa"]
    names = _SPECIALS[specials]
    tokens = [*names, *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    n_fixed = len(names) + 256
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_fixed + [-float(i) for i in range(len(pieces))])
    w.add_token_types([2] + [3] * (len(names) - 1) + [6] * 256 + [1] * len(pieces))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if len(names) > 3:
        w.add_pad_token_id(3)
    return len(tokens)


def _tensor_shapes(arch: str, e: int, h: int, kv: int, d: int, f: int, layers: int,
                   vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor llama.cpp writes for ``arch``, numpy shape (a matrix is [out, in])."""
    shapes = {"token_embd.weight": (vocab, e)}
    for i in range(layers):
        b = f"blk.{i}."
        shapes[b + "attn_norm.weight"] = (e,)
        if arch == "phi3":
            shapes[b + "attn_qkv.weight"] = ((h + 2 * kv) * d, e)
        else:
            shapes |= {b + "attn_q.weight": (h * d, e), b + "attn_k.weight": (kv * d, e),
                       b + "attn_v.weight": (kv * d, e)}
        if arch == "qwen2":
            shapes |= {b + "attn_q.bias": (h * d,), b + "attn_k.bias": (kv * d,),
                       b + "attn_v.bias": (kv * d,)}
        if arch in ("qwen3", "gemma3"):
            shapes |= {b + "attn_q_norm.weight": (d,), b + "attn_k_norm.weight": (d,)}
        shapes[b + "attn_output.weight"] = (e, h * d)
        if arch.startswith("gemma"):
            shapes |= {b + "post_attention_norm.weight": (e,), b + "post_ffw_norm.weight": (e,)}
        shapes[b + "ffn_norm.weight"] = (e,)
        if arch == "phi3":
            shapes[b + "ffn_up.weight"] = (2 * f, e)
        else:
            shapes |= {b + "ffn_gate.weight": (f, e), b + "ffn_up.weight": (f, e)}
        shapes[b + "ffn_down.weight"] = (e, f)
    shapes["output_norm.weight"] = (e,)
    if not tied:
        shapes["output.weight"] = (vocab, e)
    return shapes


def _write(path: Path, arch: str = "llama", *, tied: bool = True, name: str | None = None,
           spm: str | None = None, pre: str = "smollm", extra=None, shapes=None,
           extra_tensors: dict | None = None) -> Path:
    """A small ``arch`` GGUF at ``path``: 2 layers, hidden 64, 4 heads (2 KV) of 16, FFN 96,
    F32 random weights. ``extra(w)`` adds metadata; ``shapes(dict)`` edits the tensor
    shapes (a value None drops the tensor); ``extra_tensors`` adds tensors."""
    e, h, kv, d, f, layers = 64, 4, 2, 16, 96, 2
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name or f"tiny {arch}")
    w.add_context_length(2048)
    w.add_embedding_length(e)
    w.add_block_count(layers)
    w.add_feed_forward_length(f)
    w.add_head_count(h)
    w.add_head_count_kv(kv)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_dimension_count(d)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    vocab = _add_spm_tokenizer(w, spm) if spm else _add_byte_tokenizer(w, pre)
    if extra:
        extra(w)
    table = _tensor_shapes(arch, e, h, kv, d, f, layers, vocab, tied)
    if shapes:
        shapes(table)
    rng = np.random.default_rng(0)
    for tname, shape in table.items():
        if shape is not None:
            w.add_tensor(tname, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    for tname, data in (extra_tensors or {}).items():
        w.add_tensor(tname, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- equality with transformers ----------------------------------------------------------
def test_the_embedded_model_equals_transformers_and_builds_fast():
    GGUFModelInfo.from_path(EMBEDDED)  # imports (transformers, torch) paid once
    start = time.perf_counter()
    info = GGUFModelInfo.from_path(EMBEDDED)
    elapsed = time.perf_counter() - start
    config, tokenizer = _reference(EMBEDDED)
    _same_config(info.config, config)
    _same_tokenizer(info.tokenizer, tokenizer)
    assert info.architecture == "llama" and info.model_type == "llama"
    assert info.eos_token_ids == (2,) and info.chat_template.startswith("{% for message")
    reader = gguf.GGUFReader(str(EMBEDDED))
    assert info.weights_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert [t.name for t in info.tensors] == [t.name for t in reader.tensors]
    assert elapsed < 5.0, elapsed  # ~0.2 s on a 2-core host; transformers' path takes ~5 s


def test_the_engine_path_equals_transformers_and_its_tokenizers_are_its_own():
    """``load_tokenizer`` / ``load_hf_config`` (the engine's calls) give what transformers'
    GGUF path gives; a tokenizer one caller edits is not another's."""
    from radixlm.runtime.weights import load_hf_config, load_tokenizer

    config, tokenizer = _reference(EMBEDDED)
    first = load_tokenizer(EMBEDDED)
    _same_tokenizer(first, tokenizer)
    _same_config(load_hf_config(EMBEDDED), config)
    first.chat_template = "edited"
    first.add_tokens(["<radixlm-added>"])
    second = load_tokenizer(EMBEDDED)
    _same_tokenizer(second, tokenizer)
    assert len(second) == len(first) - 1


def test_file_config_holds_transformers_fields_and_rules():
    """``FileConfig`` of Llama / Qwen 2 / Qwen 3: transformers' fields and defaults (every
    key its ``to_dict`` writes, and nothing more), its derived fields and its shape check,
    for the values a GGUF gives; and the reader's key table is transformers' own."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from radixlm.native.file_config import GGUF_RENAMES

    assert GGUF_RENAMES == {k: GGUF_CONFIG_MAPPING[k] for k in GGUF_RENAMES}
    cases = ({}, dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                      rope_theta=5e5, tie_word_embeddings=True, vocab_size=99, bos_token_id=3,
                      eos_token_id=4, unk_token_id=0, _model_name_or_path="x"),
             dict(num_hidden_layers=3, max_position_embeddings=512, rms_norm_eps=1e-5,
                  intermediate_size=64, head_dim=8))
    for family in sorted(FAMILIES):
        for values in cases:
            ours, theirs = FileConfig(family, values), AutoConfig.for_model(family, **values)
            want = {k: v for k, v in theirs.to_dict().items() if k != "transformers_version"}
            assert ours.to_dict() == want, (family, values)
            assert copy.deepcopy(ours).to_dict() == want
            assert ours.hf().to_dict() == theirs.to_dict()
    bad = ((dict(hidden_size=100, num_attention_heads=3), "hidden size .100. is not a multiple"),
           (dict(hidden_size="x"), "hidden_size is 'x'"),
           (dict(num_attention_heads=0), "num_attention_heads is 0, not positive"),
           (dict(rms_norm_eps="tiny"), "rms_norm_eps is 'tiny'"),
           (dict(rope_theta=[1.0]), "rope_theta is"),
           (dict(tie_word_embeddings=1), "tie_word_embeddings is 1"),
           (dict(num_hidden_layers=-2), "num_hidden_layers is -2"))
    for values, message in bad:
        with pytest.raises(ValueError, match=message):
            FileConfig("llama", values)


def test_a_llama_gguf_loads_without_transformers_modeling_imports():
    """The point of ``file_config``: a Llama GGUF's config and rotary table import no
    transformers at all, and its tokenizer neither transformers' Llama config module nor
    what that pulls (torch.distributed.tensor)."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; import torch; "
            "from radixlm.runtime.weights import load_hf_config, load_tokenizer; "
            "from radixlm.runtime.models.rope import Rope; "
            f"Rope.from_hf(load_hf_config(Path({str(EMBEDDED)!r})), torch.device('cpu')); "
            "print(sorted(m for m in sys.modules if m.startswith('transformers'))); "
            f"load_tokenizer({str(EMBEDDED)!r}); "
            "print(sorted(m for m in sys.modules if m in ('transformers.activations', "
            "'torch.distributed.tensor', 'transformers.models.llama.configuration_llama')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split("\n")[:2] == ["[]", "[]"]


def test_a_qwen_gguf_tokenizer_imports_no_transformers_model_package(tmp_path):
    """Qwen 2 / 3 tokenizers are made without looking up Qwen2Tokenizer (the first
    ``transformers.models.*`` import walks every model folder); equal behaviour is
    ``test_small_files_equal_transformers``'."""
    import subprocess
    import sys

    path = _write(tmp_path / "q.gguf", arch="qwen3", pre="qwen2")
    code = ("import sys; from radixlm.runtime.weights import load_hf_config, load_tokenizer; "
            f"from pathlib import Path; load_hf_config(Path({str(path)!r})); "
            f"t = load_tokenizer(Path({str(path)!r})); "
            "print(type(t).__name__, sorted(m for m in sys.modules "
            "if m.startswith('transformers.models')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split("\n")[0] == "TokenizersBackend []"


CASES = {
    "llama-tied": dict(arch="llama"),
    "llama-untied": dict(arch="llama", tied=False),
    "llama-spm": dict(arch="llama", spm="llama"),
    "llama3-bos": dict(arch="llama", pre="llama-bpe", extra=lambda w: (
        w.add_add_bos_token(True), w.add_add_eos_token(False))),
    "mistral": dict(arch="llama", name="mistral", spm="llama"),  # transformers' Mistral rule
    "qwen2-untied": dict(arch="qwen2", tied=False, pre="qwen2"),
    "qwen2-tied": dict(arch="qwen2", pre="qwen2"),
    "qwen3": dict(arch="qwen3", pre="qwen2"),
    "gemma2": dict(arch="gemma2", spm="gemma", extra=lambda w: (
        w.add_attn_logit_softcapping(50.0), w.add_final_logit_softcapping(30.0),
        w.add_sliding_window(512))),
    "gemma3": dict(arch="gemma3", spm="gemma", extra=lambda w: (
        w.add_sliding_window(512), w.add_sliding_window_pattern([True, False]),
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(8.0))),
    "phi3": dict(arch="phi3", tied=False, spm="llama", extra=lambda w: (
        w.add_rope_dimension_count(12), w.add_sliding_window(1024),
        w.add_rope_scaling_orig_ctx_len(1024)),
        extra_tensors={"rope_factors_long.weight": np.linspace(1, 4, 6, dtype=np.float32),
                       "rope_factors_short.weight": np.linspace(1, 2, 6, dtype=np.float32)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_small_files_equal_transformers(case, tmp_path):
    path = _write(tmp_path / f"{case}.gguf", **CASES[case])
    info = GGUFModelInfo.from_path(path)
    config, tokenizer = _reference(path)
    _same_config(info.config, config)
    _same_tokenizer(info.tokenizer, tokenizer)
    assert info.config.tie_word_embeddings == CASES[case].get("tied", True)
    # what the engine calls: a tokenizer and a config of the caller's own, still equal
    _same_config(gguf_hf_config(path), config)
    own = gguf_tokenizer(path)
    assert own is not info.tokenizer
    assert own.backend_tokenizer is not info.tokenizer.backend_tokenizer
    _same_tokenizer(own, tokenizer)
    own.add_tokens(["<radixlm-edit>"])  # (an edit of one is no one else's: no shared backend)
    assert "<radixlm-edit>" not in gguf_tokenizer(path).get_vocab()
    _same_tokenizer(info.tokenizer, tokenizer)
    _same_start_tokenizer(info.start_tokenizer(), tokenizer, CASES[case])


def _same_start_tokenizer(start, reference, case: dict) -> None:
    """The engine's tokenizer (``start_tokenizer``): a byte-level Llama / Qwen vocabulary's
    is a ``FileTokenizer`` answering as transformers' does, its transformers' half equal;
    the others transformers' own."""
    from test_file_tokenizer import _same_answers

    from radixlm.native.file_tokenizer import FileTokenizer

    if case.get("spm") or case["arch"] not in ("llama", "qwen2", "qwen3"):
        assert not isinstance(start, FileTokenizer)
        return
    assert isinstance(start, FileTokenizer)
    _same_answers(start, reference)
    assert start.chat_template == reference.chat_template and start._full is None
    _same_tokenizer(start.full, reference)


def test_the_tokenizer_dict_is_transformers_own(tmp_path):
    """The metadata our walk hands the converter is what transformers' reader reads."""
    from transformers.integrations.gguf import get_gguf_tokenizer

    from radixlm.native.gguf_model import _tokenizer_inputs

    for path in (EMBEDDED, _write(tmp_path / "spm.gguf", spm="llama")):
        meta, _ = read_gguf(path, [f"tokenizer.ggml.{k}" for k in (
            "model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id",
            "eos_token_id", "unknown_token_id", "padding_token_id", "add_space_prefix",
            "add_bos_token", "add_eos_token")] + ["tokenizer.chat_template"])
        assert _tokenizer_inputs(meta, path) == get_gguf_tokenizer(str(path))[1:]


def test_end_of_turn_ids_follow_the_metadata(tmp_path):
    path = _write(tmp_path / "eot.gguf", extra=lambda w: (
        w.add_eot_token_id(4), w.add_eom_token_id(2)))
    assert GGUFModelInfo.from_path(path).eos_token_ids == (2, 4)


def _inv_freq(config) -> np.ndarray:
    import torch

    from radixlm.runtime.models.rope import rope_inv_freq

    return rope_inv_freq(config, torch.device("cpu"))[0].double().numpy()


def test_linear_and_yarn_rope_scaling_are_kept(tmp_path):
    """transformers' GGUF reader drops llama.cpp's rope scaling (its config says default);
    ours carries it as transformers' own rope parameters, all else equal."""
    linear = _write(tmp_path / "linear.gguf", extra=lambda w: (
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(4.0)))
    yarn = _write(tmp_path / "yarn.gguf", arch="qwen2", pre="qwen2", extra=lambda w: (
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN), w.add_rope_scaling_factor(4.0),
        w.add_rope_scaling_orig_ctx_len(512)))
    for path, params in ((linear, {"rope_type": "linear", "factor": 4.0}),
                         (yarn, {"rope_type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 512})):
        info = GGUFModelInfo.from_path(path)
        config, _ = _reference(path)
        assert config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}
        _same_config(info.config, config, rope_differs=True)
        assert info.config.rope_parameters == {"rope_theta": 10000.0, **params}
    base = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    assert np.allclose(_inv_freq(GGUFModelInfo.from_path(linear).config), base / 4.0)


@pytest.mark.parametrize("params", [(32.0, 1.0, 4.0, 8192), (8.0, 1.0, 4.0, 8192),
                                    (16.0, 2.0, 8.0, 4096)])
def test_llama3_rope_freqs_become_llama3_rope_parameters(params, tmp_path):
    """llama.cpp writes Llama 3's scaling as one divisor per rotated pair (``rope_freqs``,
    computed as its converter does here); the fitted parameters make transformers' llama3
    rope give the same frequencies llama.cpp runs: base / divisor."""
    factor, low, high, orig = params
    theta, d = 500000.0, 16
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float32) / d)
    divisors = []
    for freq in inv.astype(np.float64):
        wavelen = 2 * np.pi / freq
        if wavelen < orig / high:
            divisors.append(1.0)
        elif wavelen > orig / low:
            divisors.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    path = _write(tmp_path / "llama3.gguf", extra=lambda w: w.add_rope_freq_base(theta),
                  extra_tensors={"rope_freqs.weight": np.array(divisors, np.float32)})
    info = GGUFModelInfo.from_path(path)
    assert info.config.rope_parameters["rope_type"] == "llama3"
    assert np.allclose(_inv_freq(info.config), inv / np.array(divisors, np.float32),
                       rtol=1e-5)
    _same_config(info.config, _reference_config(path), rope_differs=True)


@pytest.mark.parametrize("rope", [
    {"rope_type": "default"}, {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_rope_tables_are_transformers_bits(rope, family):
    """The rotary frequencies computed in radixlm (default, linear, llama3) are the bits of
    transformers' rope functions (the model class's own for default); the others are
    transformers' (given its config)."""
    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from radixlm.runtime.models.rope import rope_inv_freq

    functions = dict(ROPE_INIT_FUNCTIONS, default={
        "llama": LlamaRotaryEmbedding, "qwen3": Qwen3RotaryEmbedding}[family]
        .compute_default_rope_parameters)
    values = dict(hidden_size=256, num_attention_heads=4, head_dim=64,
                  max_position_embeddings=4096, rope_parameters={"rope_theta": 5e5, **rope})
    for config in (AutoConfig.for_model(family, **values), FileConfig(family, values)):
        ours, scale = rope_inv_freq(config, torch.device("cpu"))
        theirs, their_scale = functions[rope["rope_type"]](
            AutoConfig.for_model(family, **values), device=torch.device("cpu"))
        assert ours.dtype == torch.float32 and torch.equal(ours, theirs.float())
        assert scale == their_scale


def _reference_config(path: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def test_an_engine_refuses_a_bad_merge_before_it_allocates(tmp_path, monkeypatch):
    """A byte-level vocabulary's damaged merge is found on the setup thread before the
    runner starts (the backend is built first, without transformers): a ValueError naming
    the file and the merge, and no runner made, nothing allocated for the weights."""
    import sys

    import radixlm.runtime.engine as engine_module

    tokens, types, merges, template = _byte_vocab()
    damaged = [*merges[:5], "Ġ t he", *merges[5:]]
    monkeypatch.setattr(sys.modules[__name__], "_byte_vocab",
                        lambda: (tokens, types, damaged, template))
    path = _write(tmp_path / "bad-merge.gguf")
    made = []
    monkeypatch.setattr("radixlm.runtime.model_runner.ModelRunner",
                        lambda *a, **k: made.append(a))
    with pytest.raises(ValueError, match=r"bad-merge\.gguf.*'Ġ t he': not two tokens"):
        engine_module.Engine(str(path), log_level="warning")
    assert made == []


def test_a_llama_gguf_converts_to_a_transformers_directory(tmp_path):
    """The test reference's conversion (``weights._convert_gguf``) of a Llama file, whose
    config radixlm builds without transformers: transformers reads the directory's config
    back equal to its own GGUF reader's, and the model's logits come out of it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from radixlm.runtime.weights import _convert_gguf

    path = _write(tmp_path / "tiny.gguf")
    out = tmp_path / "hf"
    out.mkdir()
    _convert_gguf(path, out)
    saved = AutoConfig.from_pretrained(out).to_dict()
    reference = _reference_config(path).to_dict()
    for skip in ("_name_or_path", "transformers_version", "dtype", "architectures"):
        saved.pop(skip, None), reference.pop(skip, None)
    assert saved == reference
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, saved["vocab_size"])


# ---- tensors against the config ----------------------------------------------------------
def test_an_unsupported_architecture_is_refused_by_name(tmp_path):
    path = _write(tmp_path / "a.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        GGUFModelInfo.from_path(path)


def _drop(name):
    return lambda t: t.update({name: None})


@pytest.mark.parametrize("shapes, match", [
    (_drop("blk.1.ffn_gate.weight"), r"tensor blk\.1\.ffn_gate\.weight is missing"),
    (lambda t: t.update({"blk.0.attn_q.weight": (32, 64)}),
     r"blk\.0\.attn_q\.weight has shape \[64, 32\], expected \[64, 64\]"),
    (lambda t: t.update({"blk.0.ffn_down.weight": (64, 128)}),
     r"blk\.0\.ffn_down\.weight has shape \[128, 64\], expected \[96, 64\]"),
    (lambda t: t.update({"token_embd.weight": (1300, 64)}),
     r"token_embd\.weight has shape \[64, 1300\], expected \[64, 1200\]"),
    (lambda t: t.update({"blk.2.attn_norm.weight": (64,)}),
     r"tensor blk\.2\.attn_norm\.weight is not one a llama model with 2 layers has"),
])
def test_tensors_the_config_implies(shapes, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        GGUFModelInfo.from_path(_write(tmp_path / "t.gguf", shapes=shapes))


def test_qwen2_needs_its_biases(tmp_path):
    path = _write(tmp_path / "q.gguf", arch="qwen2", pre="qwen2",
                  shapes=_drop("blk.0.attn_k.bias"))
    with pytest.raises(ValueError, match=r"blk\.0\.attn_k\.bias is missing"):
        GGUFModelInfo.from_path(path)


def test_a_vocabulary_size_the_tokenizer_does_not_have(tmp_path):
    path = _write(tmp_path / "v.gguf", extra=lambda w: w.add_vocab_size(1300),
                  shapes=lambda t: t.update({"token_embd.weight": (1300, 64)}))
    with pytest.raises(ValueError, match="tokenizer has 1200 tokens but token_embd.weight "
                                         "has 1300 rows"):
        GGUFModelInfo.from_path(path)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("params", [(32.0, 1.0, 4.0, 8192), (8.0, 1.0, 4.0, 8192)])
def test_llama3_divisors_at_real_head_dims_give_back_llama3s_parameters(head_dim, params):
    """Llama 3.1 / 3.2 (head_dim 128 / 64): the fit recovers the config's own numbers."""
    from transformers import LlamaConfig

    from radixlm.native.gguf_model import _llama3_divisors, _llama3_rope

    factor, low, high, orig = params
    expected = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": orig}
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    inv = 1.0 / 500000.0 ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    divisors = _llama3_divisors(inv, expected).astype(np.float32)
    assert _llama3_rope(config, divisors.astype(np.float64)) == expected


# ---- hostile files -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def layout():
    """Where each field of the embedded model's header lies (from GGUFReader): per key the
    offsets of its parts (key length, key, type, value...), per tensor of its info's parts
    (name length, name, n_dims, dims, type, offset), and the data start."""
    reader = gguf.GGUFReader(str(EMBEDDED))

    def parts(field) -> list[int]:
        offsets, at = [], field.offset
        for part in field.parts:
            offsets.append(at)
            at += part.nbytes
        return offsets

    keys = {k: parts(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    infos = {t.name: parts(t.field) for t in reader.tensors}
    return {"keys": keys, "tensors": infos, "data": int(reader.data_offset),
            "size": EMBEDDED.stat().st_size}


def _hostile(tmp_path: Path, layout: dict, patch=None, cut: int | None = None) -> Path:
    """The embedded model's header with ``patch(bytearray)`` applied, then a hole as long as
    its tensor data (a sparse file: no disk), or everything cut at byte ``cut``."""
    with open(EMBEDDED, "rb") as f:
        header = bytearray(f.read(layout["data"]))
    if patch:
        patch(header)
    path = tmp_path / "hostile.gguf"
    with open(path, "wb") as f:
        f.write(header[:cut] if cut is not None else header)
        if cut is None:
            f.truncate(layout["size"])
    return path


def _u32(at: int, value: int):
    return lambda b: struct.pack_into("<I", b, at, value)


def _u64(at: int, value: int):
    return lambda b: struct.pack_into("<Q", b, at, value)


KEYS = ("tokenizer.ggml.tokens", "general.name")


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def sound_peak() -> int:
    """What reading the embedded model's header (its 49k tokens decoded) allocates."""
    return _peak(lambda: read_gguf(EMBEDDED, KEYS))


def _expect(path: Path, match: str, limit: int) -> None:
    """read_gguf refuses ``path`` with a message naming the file and matching ``match``,
    allocating at most ``limit`` bytes on the way (tracemalloc sees numpy's too)."""
    errors = []

    def read():
        with pytest.raises(ValueError, match=match) as err:
            read_gguf(path, KEYS)
        errors.append(str(err.value))

    peak = _peak(read)
    assert str(path) in errors[0]
    assert peak <= limit, (peak, limit)


def test_the_sparse_copy_reads_like_the_model(tmp_path, layout):
    meta, tensors = read_gguf(_hostile(tmp_path, layout), ("general.name",))
    assert meta["general.name"].startswith("Smollm2") and len(tensors) == 272


Q, ATTN_K, TT = "blk.0.attn_q.weight", "blk.0.attn_k.weight", "tokenizer.ggml.tokens"
HOSTILE = {  # name: (patch from the layout, what the message says)
    "magic": (lambda L: lambda b: b.__setitem__(slice(0, 4), b"GGML"), "not a GGUF file"),
    "version 1": (lambda L: _u32(4, 1), "GGUF version 1 is not supported"),
    "version 99": (lambda L: _u32(4, 99), "GGUF version 99 is not supported"),
    "2^63 tensors": (lambda L: _u64(8, 2**63), f"claims {2**63} tensors"),
    "2^63 values": (lambda L: _u64(16, 2**63), f"and {2**63} metadata values"),
    "array length": (lambda L: _u64(L["keys"][TT][4], 2**62),
                     f"'{TT}' claims {2**62} values, more than"),
    "skipped array length": (lambda L: _u64(L["keys"]["tokenizer.ggml.merges"][4], 2**60),
                             "'tokenizer.ggml.merges' claims"),
    "key length": (lambda L: _u64(L["keys"]["general.architecture"][0], 2**63),
                   f"a metadata key is {2**63} bytes long"),
    "string length": (lambda L: _u64(L["keys"]["general.name"][3], 2**40),
                      f"the value of 'general.name' is {2**40} bytes long"),
    "token length": (lambda L: _u64(L["keys"][TT][5], 2**40),
                     f"string 0 of '{TT}' is {2**40} bytes long"),
    "value type": (lambda L: _u32(L["keys"]["general.name"][2], 13),
                   "'general.name' has unknown value type 13"),
    "element type": (lambda L: _u32(L["keys"][TT][3], 13),
                     f"array '{TT}' has unknown element type 13"),
    "duplicate key": (lambda L: lambda b: b.__setitem__(
        slice(L["keys"]["general.type"][1], L["keys"]["general.type"][1] + 12), b"general.name"),
        "metadata key 'general.name' appears twice"),
    "tensor type": (lambda L: _u32(L["tensors"][Q][4], 99),
                    f"tensor {Q} has unknown type id 99"),
    "5 dims": (lambda L: _u32(L["tensors"][Q][2], 5), f"tensor {Q} has 5 dimensions"),
    "2^32-1 dims": (lambda L: _u32(L["tensors"][Q][2], 2**32 - 1),
                    f"tensor {Q} has {2**32 - 1} dimensions"),
    "zero dim": (lambda L: _u64(L["tensors"][Q][3] + 8, 0), f"tensor {Q} has a zero dim"),
    "huge dim": (lambda L: _u64(L["tensors"][Q][3] + 8, 2**62), f"{Q} dims .* overflow"),
    "big dim": (lambda L: _u64(L["tensors"][Q][3] + 8, 10**9), f"{Q} runs past the end"),
    "row length": (lambda L: _u64(L["tensors"][Q][3], 560),
                   f"{Q} \\(Q4_1\\) has rows of 560 values, not a multiple of its block "
                   "size 32"),
    "misaligned": (lambda L: lambda b: struct.pack_into(
        "<Q", b, L["tensors"][Q][5], struct.unpack_from("<Q", b, L["tensors"][Q][5])[0] + 4),
        f"tensor {Q} offset \\d+ is not a multiple of the alignment 32"),
    "overlap": (lambda L: lambda b: b.__setitem__(
        slice(L["tensors"][ATTN_K][5], L["tensors"][ATTN_K][5] + 8),
        b[L["tensors"][Q][5]:L["tensors"][Q][5] + 8]),
        f"tensors ({Q} and {ATTN_K}|{ATTN_K} and {Q}) overlap"),
    "duplicate tensor": (lambda L: lambda b: b.__setitem__(
        slice(L["tensors"][ATTN_K][1], L["tensors"][ATTN_K][1] + len(Q)), Q.encode()),
        f"tensor {Q} appears twice"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_header_is_refused_by_name(case, tmp_path, layout, sound_peak):
    make_patch, match = HOSTILE[case]
    _expect(_hostile(tmp_path, layout, make_patch(layout)), match, sound_peak + (1 << 20))


@pytest.mark.parametrize("where", ["8", "24", "1000", "mid tensor infos", "last tensor"])
def test_a_cut_file_is_refused(where, tmp_path, layout, sound_peak):
    cut = {"8": 8, "24": 24, "1000": 1000,
           "mid tensor infos": layout["tensors"]["blk.14.ffn_up.weight"][3] + 3,
           "last tensor": layout["size"] - 1000}[where]
    if where == "last tensor":  # the whole header, the data one hole that stops short
        path = _hostile(tmp_path, layout)
        with open(path, "r+b") as f:
            f.truncate(cut)
    else:
        path = _hostile(tmp_path, layout, cut=cut)
    _expect(path, r"GGUF header cut|a cut or damaged header|runs past the end of the file",
            sound_peak + (1 << 20))


def test_the_model_reader_refuses_them_too(tmp_path, layout):
    path = _hostile(tmp_path, layout, _u64(8, 2**63))
    with pytest.raises(ValueError, match=f"claims {2**63} tensors"):
        GGUFModelInfo.from_path(path)


def test_an_alignment_that_is_not_a_power_of_two(tmp_path):
    path = _write(tmp_path / "a.gguf", extra=lambda w: w.add_custom_alignment(64))
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len("general.alignment") + 4
    struct.pack_into("<I", data, at, 48)
    path.write_bytes(bytes(data))
    _expect(path, "general.alignment 48 is not a power of two", 1 << 20)


def test_the_torch_paths_state_is_dequantized_into_the_models_dtype(tmp_path):
    """``load_state_dict(gguf, dtype)`` (the torch path's weights) casts each tensor as it is
    dequantized: the bits of the fp32 state cast, never the whole fp32 state in memory."""
    import torch

    from radixlm.runtime.weights import load_state_dict

    path = _write(tmp_path / "q.gguf", arch="qwen2", pre="qwen2")
    full, half = load_state_dict(path), load_state_dict(path, torch.bfloat16)
    assert sorted(full) == sorted(half) and len(full) > 10
    assert all(t.dtype == torch.float32 for t in full.values())
    for name, t in half.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, full[name].to(torch.bfloat16)), name
