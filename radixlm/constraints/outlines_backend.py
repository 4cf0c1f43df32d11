"""The outlines-core grammar backend: spec -> regex -> token index, with per-state bitmask
rows cached and shared by every request on the same compiled grammar.

Masks: row ``r`` of an int32 ``[B, ceil(vocab_size / 32)]`` array; bit ``j % 32`` of word
``j // 32`` allows token ``j``. A state's row is built once from
``Index.get_allowed_tokens`` (outlines-core's own ``Guide.write_mask_into`` costs ~90 µs per
call on a string state; copying a cached row costs < 1 µs). EOS ids are set only in final
states; bits at or beyond the tokenizer's size (padded logits) are never set. Logprobs
reported by the sampler are those of the masked distribution.
"""

from __future__ import annotations

import json
import pickle
import re
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import outlines_core

from radixlm.constraints import specs
from radixlm.constraints.base import CompilingBackend, Grammar, JumpForward
from radixlm.constraints.cache import DiskCache, LRUCache, cache_key
from radixlm.constraints.jump_forward import (
    ForcedTextFinder,
    byte_tables,
    retokenize,
    utf8_prefix,
)
from radixlm.constraints.outlines_index import build_index, byte_index, outlines_vocabulary
from radixlm.constraints.schema.metaschema import check_schema, check_whitespace_pattern
from radixlm.constraints.schema.regex_translator import SchemaTranslator
from radixlm.constraints.specs import ConstraintSpec
from radixlm.constraints.vocab import TokenVocab


@dataclass
class CompiledGrammar:
    """Immutable compiled form of one spec, shared by requests (row cache grows lazily)."""

    regex: str
    index: outlines_core.Index
    vocab: TokenVocab
    tokenizer: object
    eos_ids: tuple[int, ...]
    outlines_eos: int
    words: int
    jump: ForcedTextFinder | None
    nbytes: int = 0  # serialized index size: the memory estimate the cache is bounded by
    rows: dict[int, tuple[np.ndarray, bool]] = field(default_factory=dict)

    def row(self, state: int) -> tuple[np.ndarray, bool]:
        """(bitmask row, whether any non-EOS token is allowed) for ``state``."""
        cached = self.rows.get(state)
        if cached is not None:
            return cached
        allowed = np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)
        allowed = allowed[(allowed != self.outlines_eos) & (allowed < self.words * 32)]
        bits = np.zeros(self.words * 32, dtype=np.bool_)
        bits[allowed] = True
        has_tokens = bool(allowed.size)
        if self.index.is_final_state(state):
            bits[list(self.eos_ids)] = True
        row = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
        self.rows[state] = (row, has_tokens)
        return row, has_tokens

    def eos_row(self) -> np.ndarray:
        """Only the EOS ids (the row after EOS was accepted)."""
        bits = np.zeros(self.words * 32, dtype=np.bool_)
        bits[list(self.eos_ids)] = True
        return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)

    def new_grammar(self) -> OutlinesGrammar:
        return OutlinesGrammar(self, [self.index.get_initial_state()])


class OutlinesGrammar(Grammar):
    """Per-request state: the index states after each accepted token (for rollback)."""

    def __init__(self, compiled: CompiledGrammar, states: list[int], eos_at: int = 0):
        self.c = compiled
        self.states = states
        self.eos_at = eos_at  # len(states) right after EOS was accepted; 0 = not yet

    @property
    def state(self) -> int:
        return self.states[-1]

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        bitmask[row] = self.c.eos_row() if self.eos_at else self.c.row(self.state)[0]

    def accept_token(self, token_id: int) -> bool:
        if self.eos_at:
            return False
        if token_id in self.c.eos_ids:
            if not self.c.index.is_final_state(self.state):
                return False
            self.states.append(self.state)
            self.eos_at = len(self.states)
            return True
        if token_id not in self.c.vocab.id_to_bytes:
            return False
        nxt = self.c.index.get_next_state(self.state, token_id)
        if nxt is None:
            return False
        self.states.append(nxt)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens >= len(self.states):
            raise ValueError(f"cannot roll back {num_tokens} of {len(self.states) - 1} tokens")
        if num_tokens:
            del self.states[-num_tokens:]
        if self.eos_at > len(self.states):
            self.eos_at = 0

    def is_accepting(self) -> bool:
        """The text so far is a complete match (EOS would be allowed)."""
        return bool(self.eos_at) or self.c.index.is_final_state(self.state)

    def is_terminated(self) -> bool:
        return bool(self.eos_at) or not self.c.row(self.state)[1]

    def copy(self) -> OutlinesGrammar:
        return OutlinesGrammar(self.c, list(self.states), self.eos_at)

    def forced_text(self) -> str:
        """Text every continuation from here starts with ("" if none or disabled)."""
        if self.c.jump is None or self.eos_at:
            return ""
        return utf8_prefix(self.c.jump.forced_bytes(self.state))

    def jump_forward(self, output_ids: list[int]) -> JumpForward | None:
        """Advance over forced text (>= 2 characters): canonical retokenization of the boundary
        if the index accepts it, else the forced text's own tokens, else nothing."""
        forced = self.forced_text()
        if len(forced) < 2:
            return None
        for rollback, new_ids in retokenize(self.c.tokenizer, self.c.vocab.id_to_bytes,
                                            output_ids, forced):
            if rollback >= len(self.states):
                continue
            base = self.states[-1 - rollback]
            walked = []
            for t in new_ids:
                base = self.c.index.get_next_state(base, t) if t in self.c.vocab.id_to_bytes \
                    else None
                if base is None:
                    break
                walked.append(base)
            if base is None:
                continue
            self.rollback(rollback)
            self.states += walked
            text = b"".join(self.c.vocab.id_to_bytes[t] for t in new_ids)
            return JumpForward(rollback, list(new_ids), text.decode("utf-8", "replace"))
        return None


def _clear_errors(build, regex: str, *args) -> outlines_core.Index:
    """Run an index build, turning outlines-core's errors into messages a user can act on."""
    try:
        return build(regex, *args)
    except (ValueError, RuntimeError) as exc:
        msg = str(exc)
        if "incompatible" in msg or "no transitions" in msg.lower():
            raise ValueError(f"regex matches no string this tokenizer can produce "
                             f"(empty language): {regex[:200]!r}") from None
        raise ValueError(f"cannot compile regex {regex[:200]!r}: {msg}") from None


class OutlinesGrammarBackend(CompilingBackend):
    """Compiles specs for one tokenizer on a thread pool, with memory and disk caches.

    Budgets per compile: ``compile_timeout_s`` (the request's future fails; the worker
    finishes in the background, outlines-core can't be interrupted), ``max_regex_chars``
    and ``max_states`` (checked before building the token index), ``max_index_mb`` (the
    index's serialized size, a memory estimate checked after building; dropped if over).
    The in-memory cache holds at most ``memory_cache_size`` grammars and
    ``memory_cache_mb`` of (estimated) index memory."""

    name = "outlines"

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids, *, max_workers: int = 2,
                 compile_timeout_s: float = 30.0, max_regex_chars: int = 100_000,
                 max_index_mb: float = 512.0, enable_jump_forward: bool = True,
                 disk_cache: bool = True, memory_cache_size: int = 64,
                 strict_schema: bool = True, max_ref_depth: int = 3, max_states: int = 30_000,
                 memory_cache_mb: float = 2048.0):
        super().__init__(
            tokenizer, vocab_size, eos_token_ids, max_workers=max_workers,
            compile_timeout_s=compile_timeout_s, max_regex_chars=max_regex_chars,
            enable_jump_forward=enable_jump_forward,
            memory=LRUCache(memory_cache_size, memory_cache_mb * (1 << 20), lambda c: c.nbytes),
            counters=("compiles", "memory_hits", "disk_hits", "failures"))
        self.outlines_eos = self.eos_ids[0]
        self._ov = outlines_vocabulary(self.vocab.id_to_bytes, self.outlines_eos)
        self._byte_tables = byte_tables(self.vocab.id_to_bytes, self.outlines_eos)
        self.max_index_bytes = int(max_index_mb * (1 << 20))
        self.max_states = max_states
        self.strict_schema = strict_schema
        self.max_ref_depth = max_ref_depth
        self._disk = DiskCache() if disk_cache else None
        self._regexes = LRUCache(256)  # spec -> regex, filled by validate()

    # ----------------------------------------------------------------------- spec -> regex

    def to_regex(self, spec: ConstraintSpec) -> str:
        """The regex a spec compiles to; raises ValueError naming the problem."""
        key = spec  # (hashable: its text hashed once per object, no repr of it)
        cached = self._regexes.get(key)
        if cached is not None:
            return cached
        if spec.kind == "regex":
            if not isinstance(spec.value, str) or not spec.value:
                raise ValueError("regex must be a non-empty string")
            try:
                re.compile(spec.value)
            except (re.error, RecursionError) as exc:
                raise ValueError(f"invalid regex {spec.value!r}: {exc}") from None
            regex = spec.value
        elif spec.kind == "choices":
            regex = specs.choices_regex(tuple(spec.value))
        elif spec.kind == "dtype":
            if spec.value not in specs.DTYPE_REGEX:
                raise ValueError(f"unknown dtype {spec.value!r}")
            regex = specs.DTYPE_REGEX[spec.value]
        elif spec.kind == "json_schema":
            schema = json.loads(specs.normalize_json_schema(spec.value))
            ws = spec.whitespace_pattern  # None: the default separators
            if ws is not None:
                check_whitespace_pattern(ws)
            cls = check_schema(schema)
            regex = SchemaTranslator(schema, cls, ws, max_ref_depth=self.max_ref_depth,
                                     max_regex_chars=self.max_regex_chars,
                                     strict=self.strict_schema).translate()
        elif spec.kind in ("ebnf", "structural_tag"):
            raise ValueError(f"{spec.kind} needs the llguidance grammar backend "
                             "(this server runs --grammar-backend outlines)")
        else:
            raise ValueError(f"unknown constraint kind {spec.kind!r}")
        if len(regex) > self.max_regex_chars:
            raise ValueError(f"constraint too large: regex of {len(regex)} characters exceeds "
                             f"the budget of {self.max_regex_chars}")
        self._regexes.put(key, regex)
        return regex

    def validate(self, spec: ConstraintSpec) -> None:
        self.to_regex(spec)

    # ---------------------------------------------------------------------------- compiling

    def _key(self, regex: str) -> str:
        return cache_key(regex, self.vocab.tokenizer_hash, self.vocab_size, self.eos_ids)

    def _build(self, regex: str, key: str) -> CompiledGrammar:
        """Runs on a worker thread (outlines-core releases the GIL while building)."""
        t0 = time.perf_counter()
        index = self._disk.get(key) if self._disk else None
        nbytes = self._disk.size(key) if isinstance(index, outlines_core.Index) else 0
        if isinstance(index, outlines_core.Index):
            with self._lock:
                self._stats["disk_hits"] += 1
        else:
            # States budget, checked on the byte-level automaton (same regex, 256-token
            # vocabulary: ~1/30 of the cost). The token index costs ~0.7 ms and up to tens of
            # KiB per state here; at ~60k states one allocation went past 4 GiB and aborted.
            states = len(_clear_errors(byte_index, regex).get_transitions())
            if states > self.max_states:
                raise ValueError(f"constraint too large: {states} automaton states exceed the "
                                 f"budget of {self.max_states}")
            index = _clear_errors(build_index, regex, self._ov)
            if not index.get_final_states():
                raise ValueError(f"regex has an empty language: {regex[:200]!r}")
            data = pickle.dumps(index)
            nbytes = len(data)
            if len(data) > self.max_index_bytes:
                raise ValueError(f"constraint too large: index of {len(data) >> 20} MiB exceeds "
                                 f"the budget of {self.max_index_bytes >> 20} MiB")
            if self._disk:
                self._disk.put_bytes(key, data)
        jump = None
        if self.enable_jump_forward:
            jump = ForcedTextFinder(index, self._byte_tables, self.outlines_eos)
        compiled = CompiledGrammar(regex, index, self.vocab, self.tokenizer, self.eos_ids,
                                   self.outlines_eos, self.words, jump, nbytes)
        compiled.row(index.get_initial_state())
        with self._lock:
            self._stats["compiles"] += 1
            self._stats["compile_time_s"] += time.perf_counter() - t0
        return compiled

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        """Synchronous compile (tests, benchmarks); the scheduler uses ``compile_async``."""
        regex = self.to_regex(spec)
        key = self._key(regex)
        compiled = self._memory.get(key)
        if compiled is None:
            compiled = self._build(regex, key)
            self._memory.put(key, compiled)
        return compiled

    def compile_async(self, spec: ConstraintSpec) -> Future[Grammar]:
        out: Future[Grammar] = Future()
        try:
            regex = self.to_regex(spec)
        except ValueError as exc:
            self._fail(out, exc)
            return out
        key = self._key(regex)
        return self._serve(out, key, lambda: self._build(regex, key),
                           lambda compiled: compiled.new_grammar())
