"""A GGUF's byte-level BPE vocabulary (``tokenizer.ggml.model`` "gpt2": Llama 3, Qwen, SmolLM)
as a ``tokenizers.Tokenizer``, built the way transformers' GGUF converter builds it, without
importing transformers' ``models`` package.

transformers' converter (``integrations/gguf/gguf_tokenizer_mapping.py``) imports its GPT-2,
Llama, Gemma, T5 and Qwen tokenizer modules at the top, and the first ``transformers.models.*``
import walks all ~570 model folders to build the package's lazy import table (its cache of
the first walk, made by ``import transformers``, holds 128 of them): ~0.5 s of every engine
start on a 2-core host, for a vocabulary that is a BPE model, a byte-level pre-tokenizer and
decoder, and the file's control and user-defined tokens. This module builds that backend from
``tokenizers`` directly. ``tests/test_gguf_tokenizer.py`` checks, per pre-tokenizer type,
that it serializes to the same JSON as transformers' converter (but for GPT-2's default
token where the file has none: ``_GPT2_DEFAULT``) and that the split table is
transformers' own. Sentencepiece, Gemma, Phi-3 and unigram vocabularies stay transformers'.
"""

from __future__ import annotations

# what transformers' GGUF reader reads: tokenizer.* key -> its name in the tokenizer dict /
# the tokenizer config (``GGUF_TOKENIZER_MAPPING``; its module is the one that imports the
# model packages, so the table is here, checked equal in the test)
RENAMES = {
    "tokenizer": {
        "ggml.model": "tokenizer_type",
        "ggml.pre": "pre_tokenizer_type",
        "ggml.tokens": "tokens",
        "ggml.scores": "scores",
        "ggml.token_type": "token_type",
        "ggml.merges": "merges",
        "ggml.precompiled_charsmap": "precompiled_charsmap",
        "ggml.bos_token_id": "bos_token_id",
        "ggml.eos_token_id": "eos_token_id",
        "ggml.unknown_token_id": "unk_token_id",
        "ggml.padding_token_id": "pad_token_id",
        "ggml.add_space_prefix": "add_prefix_space",
    },
    "tokenizer_config": {
        "chat_template": "chat_template",
        "ggml.add_bos_token": "add_bos_token",
        "ggml.add_eos_token": "add_eos_token",
    },
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types
# GPT2Tokenizer's default unk, bos and eos, made special. One departure from transformers'
# converter: where the vocabulary has no such token (Llama 3's) that converter appends one,
# an id past the model's rows, so a prompt holding that text would be refused ("a token id
# outside the vocabulary"); here none is added, and the text tokenizes as llama.cpp reads it.
_GPT2_DEFAULT = "<|endoftext|>"

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> the split regex its merges were learned with (transformers' table,
# ``GGUF_PRE_TOKENIZER_SPLITS``; a type not here keeps GPT-2's byte-level split)
SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


def byte_level_backend(tokenizer_dict: dict):
    """The backend transformers' ``convert_gguf_tokenizer`` returns for a "gpt2" vocabulary:
    ``tokenizer_dict`` as transformers' GGUF reader groups the metadata (``tokens``,
    ``token_type``, ``merges``, ``pre_tokenizer_type``). ``ValueError`` for a file without
    merges (a byte-level vocabulary always carries them) or with one that is not two tokens
    of the vocabulary making a third. Returns a ``tokenizers.Tokenizer``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    if "merges" not in tokenizer_dict:
        raise ValueError("a byte-level (gpt2) GGUF vocabulary without tokenizer.ggml.merges")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = tokenizer_dict["tokens"]
    if set("".join(tokens)) <= alphabet:  # (the usual file: one check, not one per token)
        vocab = {token: index for index, token in enumerate(tokens)}
    else:
        vocab = {token if set(token) <= alphabet
                 else "".join(spelling[b] for b in token.encode("utf-8")): index
                 for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ")) for merge in tokenizer_dict["merges"]]
    try:
        backend = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None,
                                continuing_subword_prefix="", end_of_word_suffix="",
                                fuse_unk=False))
    except Exception as exc:  # (tokenizers: TypeError or its own Exception) name the merge
        _refuse_merges(merges, vocab, exc)
        raise
    split = SPLITS.get(tokenizer_dict.get("pre_tokenizer_type"))
    backend.pre_tokenizer = (
        pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                          use_regex=False)]))
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
    types = tokenizer_dict.get("token_type") or ()
    if _GPT2_DEFAULT in vocab:  # (where the file has none, none is added: _GPT2_DEFAULT)
        backend.add_special_tokens([AddedToken(_GPT2_DEFAULT, normalized=False, special=True)])
    # control tokens as special (one spelled outside the byte alphabet is a llama.cpp
    # mislabel, skipped), user-defined ones (e.g. <think>) as plain added tokens
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, kind in zip(tokens, types)
                                if kind == _CONTROL and set(t) <= alphabet])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, kind in zip(tokens, types)
                        if kind == _USER_DEFINED and t in vocab])
    return backend


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable bytes stand for themselves, the others
    for the characters from U+0100 on, in byte order (transformers' ``bytes_to_unicode``,
    equal in a test)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table = {b: chr(b) for b in kept}
    moved = [b for b in range(256) if b not in table]
    return table | {b: chr(256 + i) for i, b in enumerate(moved)}


def _refuse_merges(merges: list[tuple], vocab: dict[str, int], exc: Exception) -> None:
    """``ValueError`` naming the first merge that is not two tokens of ``vocab`` making a
    third (what the BPE refused; looked for only once it has: the walk costs ~0.08 s for
    the embedded model's 49k merges, several times that for Llama 3's 280k)."""
    for merge in merges:
        if len(merge) != 2 or not all(part in vocab for part in (*merge, "".join(merge))):
            raise ValueError(f"tokenizer.ggml.merges holds {' '.join(merge)!r}: not two "
                             "tokens of the vocabulary that make a third") from exc
