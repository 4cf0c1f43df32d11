"""outlines-core token indexes of a regex: over the tokenizer's vocabulary (the outlines
backend's grammars) and over single bytes (the same language, ~100x faster to build: the
backend's automaton-size budget and the byte-level soundness checks)."""

from __future__ import annotations

import outlines_core

_BYTE_EOS = 256


def outlines_vocabulary(id_to_bytes: dict[int, bytes], eos_token_id: int
                        ) -> outlines_core.Vocabulary:
    """outlines-core needs an EOS id; we give one and strip it from masks ourselves."""
    by_bytes: dict[bytes, list[int]] = {}
    for tid, b in id_to_bytes.items():
        by_bytes.setdefault(b, []).append(tid)
    return outlines_core.Vocabulary(eos_token_id, by_bytes)


def build_index(regex: str, vocabulary: outlines_core.Vocabulary) -> outlines_core.Index:
    """outlines-core index of ``(?:regex)$``. outlines-core 0.2.14 builds its DFA with
    leftmost-first match semantics, so once an earlier alternative has matched the whole
    regex, later ones die: ``a|ab`` would never accept "ab", ``-[1-9]|-1[0-5]`` never "-15".
    With the end anchor a match only happens at end of input and the index accepts exactly
    the regex's language. outlines-core refuses the anchor on regexes that match the empty
    string; those are built as given."""
    try:
        return outlines_core.Index(f"(?:{regex})$", vocabulary)
    except ValueError as exc:
        if "universal start state" not in str(exc):
            raise
    return outlines_core.Index(regex, vocabulary)


def byte_index(regex: str) -> outlines_core.Index:
    """outlines-core index of ``regex`` over single-byte tokens (token id = byte value; EOS
    is id 256)."""
    vocab = outlines_core.Vocabulary(_BYTE_EOS, {bytes([b]): [b] for b in range(256)})
    return build_index(regex, vocab)
