"""Incremental detokenization and stop conditions for one request.

Text grows only by whole characters: a token that ends inside a multi-byte UTF-8
character is held back until the character completes. Stop strings are matched on the
decoded text, so they are found across token boundaries; the text a stream shows holds
back any tail that could still become a stop string, so the streamed text is always a
prefix of the final text.
"""

from __future__ import annotations

import re

# ids before the read offset compared on each update: more than a jump-forward plan may roll
# back (constraints.jump_forward.LOOKBACK_TOKENS)
READ_TAIL = 8


class IncrementalDetokenizer:
    def __init__(self, tokenizer, *, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True, stop: list[str] = (),
                 stop_regex: list[str] = (), no_stop_trim: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # passed to tokenizer.decode, as SGLang does (slow tokenizers honour it; fast ones
        # never put spaces between special tokens)
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.stop = list(stop)
        self.stop_regex = [re.compile(p) for p in stop_regex]
        self.no_stop_trim = no_stop_trim
        self.text = ""  # confirmed text of the output so far (untrimmed)
        self.prefix_offset = 0
        self.read_offset = 0
        self.stop_at: int | None = None  # end of the text to return, once a stop matched
        self.matched: str | None = None
        self._read_tail: list[int] = []  # the last ids read (a jump-forward may rewrite them)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False,
            spaces_between_special_tokens=self.spaces_between_special_tokens)

    def update(self, output_ids: list[int]) -> None:
        """Consume ``output_ids`` (the whole output so far; it may have been rolled back and
        regrown by jump-forward as long as its text only grew)."""
        tail_from = max(self.read_offset - READ_TAIL, 0)
        if self.read_offset > len(output_ids) or \
                output_ids[tail_from:self.read_offset] != self._read_tail:
            self.reset(output_ids)  # rolled back, or its last tokens retokenized
            return
        before = self._decode(output_ids[self.prefix_offset:self.read_offset])
        after = self._decode(output_ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(output_ids)
            self._read_tail = output_ids[max(self.read_offset - READ_TAIL, 0):]

    def reset(self, output_ids: list[int]) -> None:
        text = self._decode(output_ids)
        while text.endswith("\ufffd") and output_ids:
            output_ids = output_ids[:-1]
            text = self._decode(output_ids)
        self.text = text
        self.prefix_offset = max(len(output_ids) - 6, 0)
        self.read_offset = len(output_ids)
        self._read_tail = list(output_ids[max(self.read_offset - READ_TAIL, 0):])

    def flush(self, output_ids: list[int]) -> None:
        """At the end: decode everything (an incomplete character becomes U+FFFD)."""
        if self.stop_at is None:
            self.text = self._decode(output_ids)

    def check_stop(self, new_from: int) -> bool:
        """Look for a stop string / regex in text added since ``new_from``; on a match,
        remember where the returned text ends. Returns True on a match."""
        if self.stop_at is not None:
            return True
        longest = max((len(s) for s in self.stop), default=0)
        start = max(new_from - longest + 1, 0)
        best: tuple[int, int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, i + len(s), s)
        for pattern in self.stop_regex:
            m = pattern.search(self.text)
            if m and (best is None or m.start() < best[0]):
                best = (m.start(), m.end(), m.group(0))
        if best is None:
            return False
        self.stop_at = best[1] if self.no_stop_trim else best[0]
        self.matched = best[2]
        return True

    def visible_text(self, final: bool) -> str:
        """Text to show now. While running, hold back a tail that may start a stop string."""
        if self.stop_at is not None:
            return self.text[: self.stop_at]
        if final or not self.stop:
            return self.text
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return self.text[: len(self.text) - hold] if hold else self.text
