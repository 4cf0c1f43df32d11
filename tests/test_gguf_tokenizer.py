"""A GGUF's byte-level vocabulary built without transformers' model packages
(``radixlm/native/gguf_tokenizer.py``) is transformers' converter's: the same backend JSON per
pre-tokenizer type, on the embedded vocabulary and on one edited to hit each rule (no
``<|endoftext|>``, control and user-defined tokens in and out of the byte alphabet), the
same tables; and a Llama GGUF's engine start imports no model package."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_PRE_TOKENIZER_SPLITS,
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

from radixlm.native.gguf_file import read_gguf
from radixlm.native.gguf_model import _tokenizer_inputs
from radixlm.native.gguf_tokenizer import RENAMES, SPLITS, byte_level_backend
from radixlm.runtime.weights import alias_paths

EMBEDDED = alias_paths()["smollm2-135m-instruct"]
_DICT: dict = {}


def _embedded_dict() -> dict:
    """The embedded model's tokenizer dict as the engine's walk hands it to the converter."""
    if not _DICT:
        keys = [f"tokenizer.{k}" for group in RENAMES.values() for k in group]
        meta, _ = read_gguf(EMBEDDED, keys)
        _DICT.update(_tokenizer_inputs(meta, EMBEDDED)[0])
    return dict(_DICT)


def _edited() -> dict:
    """The embedded vocabulary with each of the converter's rules in play: no
    ``<|endoftext|>`` (GPT-2's default specials are then added as a new token), a control
    token spelled outside the byte alphabet (a llama.cpp mislabel: skipped), user-defined
    tokens inside and outside it (the latter not in the vocabulary as spelled: skipped)."""
    d = _embedded_dict()
    tokens, types = list(d["tokens"]), list(d["token_type"])
    for index, token, kind in ((0, "<pad>", 3), (5, "<think>", 4), (6, "ctl with space", 3),
                               (7, "user é", 4), (8, "</think>", 4)):
        tokens[index], types[index] = token, kind
    return dict(d, tokens=tokens, token_type=types)


def _same(ours, theirs) -> None:
    assert json.loads(ours.to_str()) == json.loads(theirs.to_str())
    assert ours.get_vocab_size() == theirs.get_vocab_size()


def test_the_tables_are_transformers_own():
    from transformers.convert_slow_tokenizer import bytes_to_unicode as theirs

    from radixlm.native.gguf_tokenizer import bytes_to_unicode

    assert SPLITS == GGUF_PRE_TOKENIZER_SPLITS
    assert RENAMES == GGUF_TOKENIZER_MAPPING
    assert list(bytes_to_unicode().items()) == list(theirs().items())


@pytest.mark.parametrize("pre", ["smollm", "llama-bpe", "qwen2", "qwen35", "tekken", "gpt-4o",
                                 "default", None])
def test_the_backend_is_transformers_converters(pre):
    d = dict(_embedded_dict(), pre_tokenizer_type=pre)
    if pre is None:
        del d["pre_tokenizer_type"]
    ours = byte_level_backend(d)
    _same(ours, convert_gguf_tokenizer("llama", d)[0])
    ids = ours.encode("Hello world, it's 2026!  \n\tünïcödé 🙂").ids
    assert ours.decode(ids) == "Hello world, it's 2026!  \n\tünïcödé 🙂"


def test_each_added_token_rule_is_transformers():
    """transformers' rules for control and user-defined tokens; where the vocabulary has no
    ``<|endoftext|>`` (Llama 3's), none is appended (transformers' converter appends one, an
    id past the model's rows): the text tokenizes into the file's own tokens, as llama.cpp
    reads it."""
    d = _edited()
    ours, theirs = byte_level_backend(d), convert_gguf_tokenizer("llama", d)[0]
    mine, reference = json.loads(ours.to_str()), json.loads(theirs.to_str())
    appended = [t for t in reference["added_tokens"] if t["content"] == "<|endoftext|>"]
    assert [t["id"] for t in appended] == [len(d["tokens"])]
    reference["added_tokens"].remove(appended[0])
    assert mine == reference
    assert ours.get_vocab_size() == theirs.get_vocab_size() - 1 == len(d["tokens"])
    added = {t.content: t for t in ours.get_added_tokens_decoder().values()}
    assert "<|endoftext|>" not in added
    assert "ctl with space" not in added and "user é" not in added
    assert not added["<think>"].special and added["<pad>"].special
    assert ours.encode("a<think>b").ids[1] == 5  # kept whole
    text = "say <|endoftext|> here"
    ids = ours.encode(text).ids
    assert len(ids) > 3 and max(ids) < len(d["tokens"]) and ours.decode(ids) == text


def test_a_byte_level_vocabulary_without_merges_is_refused():
    d = _embedded_dict()
    del d["merges"]
    with pytest.raises(ValueError, match="without tokenizer.ggml.merges"):
        byte_level_backend(d)


def test_a_vocabulary_without_endoftext_keeps_its_size_in_the_engines_tokenizer():
    """The tokenizer the engine makes (``new_tokenizer``) of a vocabulary without
    ``<|endoftext|>``: as many tokens as the file, that text in them."""
    import dataclasses

    from radixlm.native.gguf_model import GGUFModelInfo

    info = GGUFModelInfo.from_path(EMBEDDED)
    tokens = list(info.metadata["tokenizer.ggml.tokens"])
    tokens[0] = "<pad>"  # the embedded vocabulary's <|endoftext|> (id 0), renamed
    tokenizer = dataclasses.replace(info, metadata=dict(
        info.metadata, **{"tokenizer.ggml.tokens": tokens})).new_tokenizer()
    assert len(tokenizer) == len(tokens)
    ids = tokenizer("x <|endoftext|> y", add_special_tokens=False).input_ids
    assert max(ids) < len(tokens) and tokenizer.decode(ids) == "x <|endoftext|> y"


@pytest.mark.parametrize("merge", ["Ġthe", "Ġ t he", "zz Ġthe"])
def test_a_merge_that_is_not_two_tokens_is_refused_by_name(merge):
    """A damaged merges list (a pair that is not two of the vocabulary's tokens) is a
    ValueError naming the file and the merge, not the tokenizers library's TypeError."""
    import dataclasses

    from radixlm.native.gguf_model import GGUFModelInfo

    info = GGUFModelInfo.from_path(EMBEDDED)
    merges = list(info.metadata["tokenizer.ggml.merges"])
    merges[7] = merge
    damaged = dataclasses.replace(info, metadata=dict(
        info.metadata, **{"tokenizer.ggml.merges": merges}))
    for build in (damaged.new_backend, damaged.new_tokenizer):
        with pytest.raises(ValueError, match=f"{EMBEDDED.name}.*{merge!r}: not two tokens"):
            build()


def test_a_llama_gguf_start_imports_no_model_package():
    """The config and tokenizer of a Llama GGUF with a byte-level vocabulary (Llama 3,
    SmolLM) leave transformers' ``models`` package unimported: its import walks every model
    folder (~0.5 s of a start on a 2-core host)."""
    code = ("import sys; from pathlib import Path; "
            "from radixlm.runtime.weights import load_hf_config, load_tokenizer; "
            f"load_hf_config(Path({str(EMBEDDED)!r})); t = load_tokenizer({str(EMBEDDED)!r}); "
            "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False); "
            "print(sorted(m for m in sys.modules if m == 'transformers.models' "
            "or m.startswith('transformers.models.') or m.startswith("
            "'transformers.integrations.gguf')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
