"""Prompt lookup by text: drafts where token lookup cannot see the copy.

A model copying from its prompt often tokenizes the copy differently from the prompt at the
copy's start: a value right after a JSON quote (``"Nina`` is 'N' 'ina' where the text had
' Nina'), a word at the start of a line, after a bracket or a dash. Token n-grams then find
no match although the text is the same, and every token of the copy costs a step until the
tokens line up again. ``TextLookup`` matches characters instead: the longest text of the
sequence's last 1..``max_back`` tokens (at least ``min_chars`` characters not counting
spaces) that occurs in the prompt's text, at its latest occurrence, and drafts the
tokenization of the ``window`` characters that follow it there. The verifier decides what
is kept, so a tokenization that differs from the model's own costs only the draft.

Plain Python over the engine's tokenizer (its Rust ``backend_tokenizer`` where it has one:
no Python per call, and only shared reads of it, as the other threads do); the prompt is
decoded once per request, on the first call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def text_codec(tokenizer: Any) -> tuple[Callable[[list[int]], str], Callable[[str], list[int]]]:
    """``(decode, encode)`` of ``tokenizer`` without special tokens either way."""
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is not None:
        return (lambda ids: fast.decode(ids, skip_special_tokens=True),
                lambda text: fast.encode(text, add_special_tokens=False).ids)
    return (lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            lambda text: tokenizer.encode(text, add_special_tokens=False))


class TextLookup:
    """Text-level prompt lookup for one request.

    ``codec``: ``text_codec(tokenizer)``. ``n_prompt``: the request's prompt length.
    ``propose(tokens, k)`` takes the request's sequence (prompt, then output: the prompt's
    text is decoded from its first ``n_prompt`` tokens on the first call) and returns at
    most ``k`` ids, [] where its last tokens' text does not occur in the prompt's text.
    """

    __slots__ = ("decode", "encode", "n_prompt", "min_chars", "max_back", "window", "_text")

    def __init__(self, codec: tuple[Callable, Callable], n_prompt: int, *,
                 min_chars: int = 2, max_back: int = 4, window: int = 64) -> None:
        if min_chars < 1 or max_back < 1 or window < 1:
            raise ValueError(f"need min_chars, max_back and window >= 1, got {min_chars}, "
                             f"{max_back}, {window}")
        (self.decode, self.encode), self.n_prompt = codec, n_prompt
        self.min_chars, self.max_back, self.window = min_chars, max_back, window
        self._text: str | None = None

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` ids: the tokenized prompt text after the latest occurrence of the
        longest matching text of ``tokens``' last 1..``max_back`` tokens."""
        if k <= 0 or not tokens:
            return []
        if self._text is None:
            self._text = self.decode(tokens[:self.n_prompt])
        text, end = self._text, -1
        for m in range(1, min(self.max_back, len(tokens)) + 1):
            piece = self.decode(tokens[-m:])
            if len(piece.strip()) < self.min_chars:
                continue
            at = text.rfind(piece)
            if at < 0:  # a longer piece holds this one: it cannot occur either
                break
            end = at + len(piece)
        if end < 0 or end >= len(text):
            return []
        draft = self.encode(text[end:end + self.window])
        return [int(t) for t in draft[:k]]
