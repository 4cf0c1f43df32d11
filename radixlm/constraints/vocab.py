"""The tokenizer's vocabulary as raw bytes (``TokenVocab``), what both backends build on.

Tokens are mapped to the exact bytes they spell, never through a lossy string round trip:
byte-level BPE tokens (GPT-2, Llama 3, SmolLM2) go through the inverse of GPT-2's
byte-to-unicode table; SentencePiece tokens map ``▁`` to a space and ``<0xHH>`` to that
byte. Special and added-special tokens are left out: EOS is handled by the grammar, outside
the index, and other special tokens are never allowed under a constraint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (printable stand-ins for all 256 bytes)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[int, str]:
    """``str.translate`` table of ``unicode_to_bytes``: a stand-in to the Latin-1 character of
    its byte; any other character below 256 to one Latin-1 cannot encode (a character
    outside the table spells no byte; those from 256 up fail the encoding unchanged)."""
    table = {c: "\U0010ffff" for c in range(256)}
    table.update({ord(ch): chr(b) for ch, b in unicode_to_bytes().items()})
    return table


def token_bytes(token: str, byte_level: bool) -> bytes | None:
    """The bytes a vocabulary string stands for (None if it can't be decoded losslessly)."""
    if byte_level:  # (in C: TokenVocab of a 49k vocabulary 0.08 s; a character at a time 0.19)
        try:
            return token.translate(_byte_level_table()).encode("latin-1")
        except UnicodeEncodeError:
            return None
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


@dataclass(frozen=True)
class TokenVocab:
    """Token id -> bytes for every usable (non-special) token, plus a content hash."""

    id_to_bytes: dict[int, bytes]
    special_ids: frozenset[int]
    tokenizer_hash: str

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenVocab:
        byte_level = _is_byte_level(tokenizer)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        for tid, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
            if getattr(tok, "special", False):
                special.add(tid)
        id_to_bytes: dict[int, bytes] = {}
        for token, tid in tokenizer.get_vocab().items():
            if tid in special:
                continue
            b = token_bytes(token, byte_level)
            if b:
                id_to_bytes[tid] = b
        h = hashlib.sha256()
        for tid in sorted(id_to_bytes):
            h.update(tid.to_bytes(4, "little") + len(id_to_bytes[tid]).to_bytes(2, "little"))
            h.update(id_to_bytes[tid])
        return cls(id_to_bytes, frozenset(special), h.hexdigest()[:16])

    @cached_property
    def by_bytes(self) -> dict[bytes, int]:
        """A token's bytes -> the token (the highest id where several spell the same)."""
        return {b: t for t, b in self.id_to_bytes.items() if b}

    @cached_property
    def longest(self) -> int:
        """The most bytes of a token."""
        return max(map(len, self.by_bytes), default=1)

    def spell(self, data: bytes, mask: Callable[[], np.ndarray],
              take: Callable[[int], bool]) -> list[int] | None:
        """``data`` in tokens a grammar state allows one by one: at each position the
        longest token that starts the bytes left and that ``mask()`` (the state's bitmask
        row now: int32 words, bit t of word t // 32 for token t) allows, which ``take``
        then advances the state over (False: refused). None when no allowed token starts
        what is left, or ``take`` refuses one; the caller undoes what was taken."""
        ids: list[int] = []
        pos = 0
        while pos < len(data):
            row = mask()
            token = None
            for end in range(min(len(data), pos + self.longest), pos, -1):
                t = self.by_bytes.get(data[pos:end])
                if t is not None and allows(row, t):
                    token = t
                    break
            if token is None or not take(token):
                return None
            ids.append(token)
            pos += len(self.id_to_bytes[token])
        return ids


def allows(row: np.ndarray, token: int) -> bool:
    """Whether bitmask row ``row`` (int32 words) allows ``token``."""
    return token < row.size * 32 and bool((int(row[token >> 5]) >> (token & 31)) & 1)
