"""Drive a grammar without a model (for the tests and ``bench_schema_coverage.py``): random
walks and acceptance checks, through a grammar's token masks or a byte-level index.

``random_walk`` samples uniformly among allowed tokens for a while, then prefers tokens that
close things (quotes, brackets, EOS) so that walks end; it returns the token ids and whether
the grammar terminated. ``accepts_text`` tokenizes a string canonically and asks the grammar.
"""

from __future__ import annotations

import random

import numpy as np
import outlines_core

from radixlm.constraints.base import Grammar

_CLOSERS = ['"}', '"]', '"', "}", "]", "},", "],", ",", "0", "1", "true", "null", "a"]


def allowed_ids(grammar: Grammar, words: int) -> np.ndarray:
    """Token ids the grammar allows now (via its bitmask row)."""
    mask = np.zeros((1, words), dtype=np.int32)
    grammar.fill_bitmask(mask, 0)
    return np.nonzero(np.unpackbits(mask[0].view(np.uint8), bitorder="little"))[0]


def random_walk(grammar: Grammar, tokenizer, words: int, eos_ids, seed: int,
                explore_steps: int = 30, max_steps: int = 400,
                jump_forward: bool = False) -> tuple[list[int], bool, int]:
    """Walk ``grammar`` to EOS. Returns (output ids without EOS, terminated, forced tokens)."""
    rng = random.Random(seed)
    closers = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(c))[0] for c in _CLOSERS
               if len(tokenizer.tokenize(c)) == 1]
    eos = set(eos_ids)
    out: list[int] = []
    forced = 0
    for step in range(max_steps):
        if grammar.is_terminated():
            return out, True, forced
        allowed = allowed_ids(grammar, words)
        if allowed.size == 0:
            return out, False, forced
        finishing = step >= explore_steps
        allowed_set = set(allowed.tolist())
        pick = None
        if eos & allowed_set and (finishing or rng.random() < 0.3):
            pick = min(eos & allowed_set)
        elif finishing and rng.random() < 0.8:
            pick = next((c for c in closers if c in allowed_set), None)
        if pick is None:
            choices = [t for t in allowed.tolist() if t not in eos] or allowed.tolist()
            pick = rng.choice(choices)
        assert grammar.accept_token(pick), f"grammar refused its own allowed token {pick}"
        if pick in eos:
            return out, True, forced
        out.append(pick)
        if jump_forward:
            plan = grammar.jump_forward(out)
            if plan is not None:
                if plan.rollback:
                    del out[-plan.rollback:]
                out += plan.token_ids
                forced += len(plan.token_ids)
    return out, grammar.is_terminated(), forced


def accepts_text(grammar: Grammar, tokenizer, text: str) -> bool:
    """Whether ``text`` (canonically tokenized) leads the grammar to an accepting state."""
    g = grammar.copy()
    for t in tokenizer.encode(text, add_special_tokens=False):
        if not g.accept_token(t):
            return False
    return g.is_accepting()  # type: ignore[attr-defined]


# ------------------------------------------------------------------ byte-level (regex) checks
# An index over a 256-token vocabulary of single bytes has the same language as the real one
# (same regex, same Rust DFA) but builds ~100x faster (``outlines_index.byte_index``): what
# the soundness checks walk.

_BYTE_EOS = 256  # the byte-level index's EOS id (outlines_index.byte_index)
_BYTE_CLOSERS = b'"}],0a1'


def index_accepts(index: outlines_core.Index, data: bytes) -> bool:
    """Whether the byte-level ``index`` matches exactly ``data``."""
    state = index.get_initial_state()
    for b in data:
        state = index.get_next_state(state, b)
        if state is None:
            return False
    return index.is_final_state(state)


def byte_random_walk(index: outlines_core.Index, seed: int, explore_steps: int = 40,
                     max_steps: int = 3000) -> bytes | None:
    """A random member of the index's language (None if the walk didn't end)."""
    rng = random.Random(seed)
    state = index.get_initial_state()
    out = bytearray()
    for step in range(max_steps):
        allowed = index.get_allowed_tokens(state)
        final = index.is_final_state(state)
        if final and (step >= explore_steps or rng.random() < 0.2 or len(allowed) == 1):
            return bytes(out)
        choices = [t for t in allowed if t != _BYTE_EOS]
        if not choices:
            return bytes(out) if final else None
        pick = None
        if step >= explore_steps and rng.random() < 0.8:
            pick = next((b for b in _BYTE_CLOSERS if b in choices), None)
        if pick is None:
            pick = rng.choice(choices)
        state = index.get_next_state(state, pick)
        out.append(pick)
    return None
