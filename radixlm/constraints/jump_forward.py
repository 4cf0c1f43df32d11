"""Jump-forward (SGLang's compressed FSM): find text the grammar forces and splice it in.

Forced text is read off the token index itself rather than a second, character-level
automaton, so the two can never disagree: from an index state that is not final, if every
allowed token starts with the same byte ``b``, then every continuation starts with ``b``;
take the single-byte token for ``b``, step, and repeat. (outlines-core lists a token as
allowed iff its bytes lead to a live state; byte-level vocabularies hold a token for every
byte that occurs in text, so "all allowed tokens share a first byte" is exactly "the
automaton has one way forward".) Results are cached per compiled grammar and state.

The forced bytes are then tokenized canonically together with the last few output tokens,
so that e.g. ``"`` followed by forced ``name":`` becomes the tokens a tokenizer would have
produced for ``"name":``; the plan says how many old tokens to drop.
"""

from __future__ import annotations

import numpy as np

MAX_FORCED_BYTES = 256
LOOKBACK_TOKENS = 3  # old tokens re-tokenized together with the forced text


def byte_tables(id_to_bytes: dict[int, bytes],
                outlines_eos: int) -> tuple[np.ndarray, dict[int, int]]:
    """Per token id its first byte (256: no such token), and byte -> single-byte token."""
    first_byte = np.full(max(max(id_to_bytes), outlines_eos) + 1, 256, dtype=np.int16)
    byte_token: dict[int, int] = {}
    for tid, b in id_to_bytes.items():
        first_byte[tid] = b[0]
        if len(b) == 1:
            byte_token[b[0]] = tid
    return first_byte, byte_token


class ForcedTextFinder:
    """state -> forced bytes, for one compiled index (shared by all its requests)."""

    def __init__(self, index, tables: tuple[np.ndarray, dict[int, int]], outlines_eos: int):
        """``tables``: ``byte_tables(...)`` of the vocabulary (the same for every index)."""
        self.index = index
        self.first_byte, self.byte_token = tables
        self.outlines_eos = outlines_eos
        self._cache: dict[int, bytes] = {}

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every continuation from ``state`` starts with (b"" if none)."""
        cached = self._cache.get(state)
        if cached is not None:
            return cached
        out = bytearray()
        visited = []
        s = state
        while len(out) < MAX_FORCED_BYTES and not self.index.is_final_state(s):
            if s in self._cache:  # reuse a suffix found earlier
                out += self._cache[s]
                break
            allowed = np.asarray(self.index.get_allowed_tokens(s), dtype=np.int64)
            allowed = allowed[allowed != self.outlines_eos]
            if allowed.size == 0:
                break
            fb = self.first_byte[allowed]
            b = int(fb[0])
            if b == 256 or (fb != b).any() or b not in self.byte_token:
                break
            nxt = self.index.get_next_state(s, self.byte_token[b])
            if nxt is None:
                break
            visited.append((s, len(out)))
            out.append(b)
            s = nxt
        result = bytes(out)
        for st, offset in visited:  # every state on the path has the matching suffix
            self._cache.setdefault(st, result[offset:])
        self._cache.setdefault(state, result)
        return result


def utf8_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is complete UTF-8, decoded."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


def retokenize(tokenizer, id_to_bytes: dict[int, bytes], output_ids: list[int], forced: str,
               lookback: int = LOOKBACK_TOKENS) -> list[tuple[int, list[int]]]:
    """Candidate plans ``(rollback, new_token_ids)``, best first: the canonical tokenization of
    (last few output tokens + forced text), then the forced text tokenized alone."""
    plans: list[tuple[int, list[int]]] = []
    k = min(lookback, len(output_ids))
    while k > 0:  # the old tail must decode on its own (not start inside a character)
        tail = b"".join(id_to_bytes.get(t, b"\x00\xff") for t in output_ids[-k:])
        try:
            prev = tail.decode("utf-8")
            break
        except UnicodeDecodeError:
            k -= 1
    else:
        prev = ""
    for old_len, text in ((k, prev + forced), (0, forced)):
        new = tokenizer.encode(text, add_special_tokens=False)
        if b"".join(id_to_bytes.get(t, b"\x00\xff") for t in new) != text.encode("utf-8"):
            continue  # the tokenizer changed the text (prefix space, normalization)
        old = output_ids[len(output_ids) - old_len:]
        common = 0
        while common < min(len(old), len(new)) and old[common] == new[common]:
            common += 1
        plan = (old_len - common, new[common:])
        if plan[1] and plan not in plans:
            plans.append(plan)
    return plans
