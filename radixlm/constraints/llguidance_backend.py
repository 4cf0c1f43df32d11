"""The llguidance grammar backend (the default): every spec kind becomes an llguidance grammar
(Lark-like CFG with regex lexemes) matched token by token by a Rust ``LLMatcher``.

Compiling is building one ``LLMatcher`` per grammar on a worker thread (llguidance drops the
GIL while it builds); each request gets a ``deep_copy`` of that template. Masks are computed
lazily by the matcher (no per-state tables), for the whole batch at once by an
``LLExecutor`` off the GIL (``fill_bitmasks``). Jump-forward comes from the matcher's forced
bytes (``compute_ff_bytes``), spliced in with the same canonical retokenization of the boundary
as the outlines backend.

Schemas first go through ``schema.llg_rewrite.prepare_schema``: objects that list
``properties`` are closed unless the schema says otherwise, as xgrammar's strict mode does in
SGLang, and keywords llguidance refuses but that have exact (or sound-subset) rewrites are
rewritten (disjoint ``oneOf``, simple ``not`` forms, ``dependencies``, formats). Strict JSON
Schema: the compiler runs with ``lenient: false``, so a keyword it does not implement (other
``not`` forms, ``if``/``then``, ``contains``, overlapping ``oneOf``, ...) is an error naming
it; such a schema then goes through the project's regex translator instead. llguidance does
not know the draft-3 keywords (``disallow``, ``extends``, ``divisibleBy``) at all and would
ignore them as annotations: those are rejected here by name (``unenforced_keywords``).
Budgets: ``compile_timeout_s`` per compile, ``LLParserLimits`` (lexer fuel and Earley items
per mask, grammar size) per request; a mask that runs out of fuel leaves the matcher in an
error state and the request is aborted with its message, never continued unconstrained.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
import time
from concurrent.futures import Future
from typing import Any

import jsonschema
import llguidance as llg
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark

from radixlm.constraints import specs
from radixlm.constraints.base import CompilingBackend, Grammar, JumpForward
from radixlm.constraints.cache import LRUCache, cache_key
from radixlm.constraints.closing import (
    ByteTwin,
    bfs_close,
    byte_matcher,
    close_bytes,
    grammar_hints,
)
from radixlm.constraints.jump_forward import retokenize, utf8_prefix
from radixlm.constraints.schema.llg_rewrite import (
    UNREPORTED_KEYWORDS,
    prepare_schema,
    unenforced_keywords,
)
from radixlm.constraints.schema.metaschema import check_whitespace_pattern, meta_check
from radixlm.constraints.schema.regex_translator import SchemaTranslator
from radixlm.constraints.specs import DEFAULT_SEPARATORS, ConstraintSpec

logger = logging.getLogger(__name__)


def structural_tag_grammar(value: Any) -> str:
    """SGLang's ``structural_tag`` (``{"structures": [{"begin", "schema", "end"}],
    "triggers": [...]}``, optionally with ``"type": "structural_tag"``) -> an llguidance
    grammar: free text, in which a trigger starts a tagged segment whose body must match its
    schema. Raises ValueError naming the problem."""
    value = specs.structural_tag_object(value)
    unknown = sorted(set(value) - {"type", "structures", "triggers"})
    if unknown:
        raise ValueError(f"structural_tag: unknown field(s) {', '.join(unknown)}")
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise ValueError("structural_tag.structures must be a non-empty list")
    if (not isinstance(triggers, list) or not triggers
            or not all(isinstance(t, str) and t for t in triggers)):
        raise ValueError("structural_tag.triggers must be a non-empty list of strings")
    tags = []
    for i, st in enumerate(structures):
        where = f"structural_tag.structures[{i}]"
        if not isinstance(st, dict) or set(st) - {"begin", "schema", "end"}:
            raise ValueError(f"{where} must be an object with begin, schema, end")
        begin, end, schema = st.get("begin"), st.get("end", ""), st.get("schema")
        if not isinstance(begin, str) or not begin or not isinstance(end, str):
            raise ValueError(f"{where}: begin must be a non-empty string, end a string")
        trig = [t for t in triggers if begin.startswith(t)]
        if not trig:
            raise ValueError(f"{where}: begin {begin!r} starts with none of the triggers")
        if not isinstance(schema, dict):
            raise ValueError(f"{where}.schema must be a JSON schema object")
        meta_check(schema)
        bad = unenforced_keywords(schema)
        if bad:
            raise ValueError(f"{where}.schema: unsupported keyword {bad[0]}")
        tags.append(llg.StructTag(trigger=max(trig, key=len), begin=begin,
                                  grammar=prepare_schema(schema),
                                  end=end))
    return llg.StructTag.to_grammar(tags, assume_special=False)


def ebnf_grammar(text: Any) -> str:
    """An ``ebnf`` value (GBNF as llama.cpp writes it, ``root ::= ...``, or llguidance's
    Lark, ``start: ...``) -> an llguidance grammar. Raises ValueError on a syntax error."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("ebnf must be a non-empty grammar string")
    try:
        lark = any_to_lark(text)
    except Exception as exc:  # noqa: BLE001 - the converter's message is the user's answer
        raise ValueError(f"invalid ebnf grammar: {exc}") from None
    return llg.LLMatcher.grammar_from_lark(lark)


class Compiled:
    """One compiled grammar, shared by the requests of its key: the token-level matcher
    template, the grammar text it was built from (after a fallback to the regex translator),
    and, made on first use (by requests that must close within their budget), the
    byte-level template of ``closing`` with the grammar's search hints, and the close of the
    start state (searched once, with a larger bound than a close mid-document)."""

    def __init__(self, matcher: llg.LLMatcher, grammar: str) -> None:
        self.matcher = matcher
        self.grammar = grammar
        self._lock = threading.RLock()
        self._byte: llg.LLMatcher | None = None
        self.hints: tuple[bytes, ...] = ()
        self._initial: tuple[bytes, list[int]] | None = None

    def byte_template(self, backend: LLGuidanceBackend) -> llg.LLMatcher:
        with self._lock:
            if self._byte is None:
                self.hints = grammar_hints(self.grammar)
                self._byte = byte_matcher(self.grammar, backend.limits)
            return self._byte

    def initial_close(self, backend: LLGuidanceBackend) -> tuple[bytes, list[int]] | None:
        """The close of the start state: (its bytes, its tokens), or None when none."""
        with self._lock:
            if self._initial is None:
                data = close_bytes(self.byte_template(backend).deep_copy(), self.hints,
                                   long=True)
                ids = (None if data is None else
                       backend.spell_close(self.matcher.deep_copy(), data))
                self._initial = (b"", None) if ids is None else (data, ids)
            data, ids = self._initial
        return None if ids is None else (data, list(ids))


class LLGuidanceGrammar(Grammar):
    """Per-request state: one ``LLMatcher``, the tokens it accepted, whether EOS was taken,
    and (made on the first ``close_tokens``) its byte-level twin."""

    def __init__(self, backend: LLGuidanceBackend, compiled: Compiled, matcher: llg.LLMatcher,
                 eos_done=False):
        self.b = backend
        self.compiled = compiled
        self.m = matcher
        self.tokens: list[int] = []  # accepted, EOS excluded
        self.eos_done = eos_done
        self._twin: ByteTwin | None = None
        # the close close_fits kept last: (accepted tokens then, its bytes, its tokens or
        # None when only its bytes were checked)
        self._fit: tuple[int, bytes, list[int] | None] | None = None

    @property
    def accepted(self) -> int:
        return len(self.tokens)

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        if self.eos_done or self.m.is_stopped():
            bitmask[row] = self.b.eos_row
            return
        self.b.fill_rows([(self, row)], bitmask)

    def accept_token(self, token_id: int) -> bool:
        if self.eos_done:
            return False
        if token_id in self.b.eos_ids:
            if not (self.m.is_accepting() or self.m.is_stopped()):
                return False
            self.eos_done = True
            return True
        if self.m.try_consume_tokens([int(token_id)]) != 1:
            return False
        self.tokens.append(int(token_id))
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens > self.accepted + int(self.eos_done):
            raise ValueError(f"cannot roll back {num_tokens} of {self.accepted} tokens")
        if num_tokens and self.eos_done:
            self.eos_done = False
            num_tokens -= 1
        if num_tokens:
            self.m.rollback(num_tokens)
            del self.tokens[-num_tokens:]
            self._forget_after(self.accepted)

    def _forget_after(self, n: int) -> None:
        """Drop the kept close if it was kept past ``n`` accepted tokens."""
        if self._fit is not None and self._fit[0] > n:
            self._fit = None

    def is_accepting(self) -> bool:
        return self.eos_done or self.m.is_accepting()

    def is_terminated(self) -> bool:
        return self.eos_done or self.m.is_stopped()

    def error(self) -> str | None:
        """The matcher's error (e.g. a mask budget ran out), or None."""
        return self.m.get_error() if self.m.is_error() else None

    def copy(self) -> LLGuidanceGrammar:
        g = LLGuidanceGrammar(self.b, self.compiled, self.m.deep_copy(), self.eos_done)
        g.tokens = list(self.tokens)
        g._twin = self._twin.copy() if self._twin is not None else None
        g._fit = self._fit
        return g

    def close_tokens(self) -> list[int] | None:
        """A short valid close from here, in tokens this matcher takes one by one (``[]``
        when accepting; None when none was found): the close ``close_fits`` last kept when
        it was kept at this very state, else ``closing``'s search on the byte-level twin."""
        if self._done():
            return []
        n = self.accepted
        if not n:  # the grammar's start: the same for every request
            found = self.compiled.initial_close(self.b)
            return None if found is None else list(found[1])
        if self._fit is not None and self._fit[0] == n:
            _, data, ids = self._fit
            ids = ids if ids is not None else self.b.spell_close(self.m, data)
            if ids is not None:
                return list(ids)
        if not self._synced():
            return None
        data = self._twin.close()
        return None if data is None else self.b.spell_close(self.m, data)

    def close_fits(self, room: int) -> bool:
        """Whether a close of at most ``room`` tokens is known from here; it is kept (for
        ``close_tokens`` after a rollback to this state) only when it fits. Cheapest first:
        the close kept one token ago, or its rest after that token, when it still closes
        the document (checked on the twin, a few microseconds a byte); then a fresh greedy
        close on the twin without the branch lookahead, if its bytes fit (about a
        millisecond); then with it (tens); then the breadth-first pass. Each fits by its
        bytes (which bound its tokens), else spelt in tokens (``_keep``)."""
        if room < 0:
            return False
        if self._done():
            return True
        n = self.accepted
        if not n:
            found = self.compiled.initial_close(self.b)
            if found is None or len(found[1]) > room:
                return False
            self._fit = (0, found[0], list(found[1]))
            return True
        if not self._synced():
            return False
        candidates: list[bytes] = []
        if self._fit is not None and self._fit[0] == n - 1:
            _, data, ids = self._fit
            last = self.b.spell_token(self.tokens[-1])
            if ids and ids[0] == self.tokens[-1]:
                if len(ids) - 1 <= room:  # (its first token was taken: the rest was spelt
                    self._fit = (n, data[len(last):], ids[1:])  # from this very state)
                    return True
            elif last and data.startswith(last):
                candidates.append(data[len(last):])
            candidates.append(data)
            candidates = [c for c in candidates if self._twin.closes_with(c)]
        if any(self._keep(n, data, room) for data in candidates):
            return True
        quick = self._twin.close(lookahead=False)  # (when no kept close fits)
        if quick is not None and len(quick) <= room:
            return self._keep(n, quick, room)
        fresh = self._twin.close()
        if fresh is not None and fresh not in candidates and self._keep(n, fresh, room):
            return True
        other = bfs_close(self._twin.m)
        return other is not None and other != fresh and self._keep(n, other, room)

    def _done(self) -> bool:
        return self.eos_done or self.m.is_accepting() or self.m.is_stopped()

    def _synced(self) -> bool:
        """The byte-level twin brought to the accepted tokens (made on first use)."""
        if self._twin is None:
            self._twin = ByteTwin(self.compiled.byte_template(self.b), self.b.spell_token,
                                  self.compiled.hints)
        return self._twin.sync(self.tokens)

    def _keep(self, n: int, data: bytes, room: int) -> bool:
        """Keep close ``data`` (bytes the twin checked) at ``n`` tokens if it fits ``room``:
        by its bytes, which bound its tokens, else spelt in tokens (full-vocabulary masks)."""
        if len(data) <= room:
            self._fit = (n, data, None)
            return True
        ids = self.b.spell_close(self.m, data)
        if ids is None or len(ids) > room:
            return False
        self._fit = (n, data, ids)
        return True

    def forced_text(self) -> str:
        if not self.b.enable_jump_forward or self.is_terminated():
            return ""
        return utf8_prefix(self.m.compute_ff_bytes())

    def jump_forward(self, output_ids: list[int]) -> JumpForward | None:
        """Splice in the forced text (>= 2 characters), with the last few output tokens
        retokenized canonically together with it when the matcher accepts that."""
        forced = self.forced_text()
        if len(forced) < 2:
            return None
        for rollback, new_ids in retokenize(self.b.tokenizer, self.b.vocab.id_to_bytes,
                                            output_ids, forced):
            if rollback > self.accepted:
                continue
            self.m.rollback(rollback)  # (self.tokens is untouched until the plan holds)
            took = self.m.try_consume_tokens(new_ids)
            if took == len(new_ids):
                if rollback:
                    del self.tokens[-rollback:]
                    self._forget_after(self.accepted)
                self.tokens.extend(int(t) for t in new_ids)
                text = b"".join(self.b.vocab.id_to_bytes[t] for t in new_ids)
                return JumpForward(rollback, list(new_ids), text.decode("utf-8", "replace"))
            self.m.rollback(took)  # undo the partial plan and restore the old tail
            if rollback and self.m.try_consume_tokens(output_ids[-rollback:]) != rollback:
                raise RuntimeError("jump-forward could not restore the grammar state")
        return None


def _tokenizer_json(tokenizer) -> str:
    """A fast tokenizer's JSON without padding or truncation, as ``llguidance.hf.
    from_tokenizer`` serializes it (a copy of the backend with both turned off; the backend
    itself where neither is set: the same text, without the ~0.1 s copy). Any tokenizer
    with a ``tokenizers`` backend (``backend_tokenizer``: transformers' fast ones, the
    engine's ``FileTokenizer``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("llguidance needs a fast (tokenizers-backed) tokenizer, got "
                         f"{type(tokenizer).__name__}")
    if backend.padding is None and backend.truncation is None:
        return backend.to_str()
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()


class LLGuidanceBackend(CompilingBackend):
    """Compiles specs to llguidance matchers for one tokenizer (HF fast tokenizers).

    ``max_workers`` compile threads; ``mask_threads`` threads of the batch mask executor;
    ``compile_timeout_s`` bounds one compile (the request fails; the build finishes in the
    background); ``limits`` (``llguidance.LLParserLimits``) bounds every mask and grammar;
    ``memory_cache_size`` compiled templates are kept; ``max_regex_chars`` bounds the regex of
    a schema that falls back to the translator."""

    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids, *, max_workers: int = 2,
                 compile_timeout_s: float = 30.0, enable_jump_forward: bool = True,
                 memory_cache_size: int = 256, mask_threads: int = 2,
                 limits: llg.LLParserLimits | None = None, max_regex_chars: int = 100_000):
        super().__init__(
            tokenizer, vocab_size, eos_token_ids, max_workers=max_workers,
            compile_timeout_s=compile_timeout_s, max_regex_chars=max_regex_chars,
            enable_jump_forward=enable_jump_forward, memory=LRUCache(memory_cache_size),
            counters=("compiles", "memory_hits", "failures"))
        self._ll_json = _tokenizer_json(tokenizer)  # (read here: the caller's thread)
        self._ll_tokenizer = None  # parsed on first use or by warm() (~0.2-0.4 s)
        self._ll_error: str | None = None  # why llguidance could not parse it (kept)
        self._ll_lock = threading.Lock()
        bits = np.zeros(self.words * 32, dtype=np.bool_)
        bits[list(self.eos_ids)] = True
        self.eos_row = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
        self.limits = limits
        self._executor = llg.LLExecutor(max(1, mask_threads))
        # spec -> (grammar, its compiled-grammar cache key), filled by validate(): a hit
        # hashes the spec's text once per object (no repr of it, no SHA-256 of the grammar)
        self._checked = LRUCache(256)

    @property
    def ll_tokenizer(self) -> llg.LLTokenizer:
        """llguidance's tokenizer (its own parse of the fast tokenizer's JSON), made once
        by the first caller (a compile worker or ``warm``); the others wait for it. Where
        llguidance cannot parse it, every caller gets a ``ValueError`` saying so (the parse
        is not retried)."""
        with self._ll_lock:
            if self._ll_tokenizer is None and self._ll_error is None:
                try:
                    self._ll_tokenizer = llg.LLTokenizer(
                        self._ll_json, n_vocab=self.vocab_size, eos_token=list(self.eos_ids))
                except Exception as exc:  # noqa: BLE001  # (llguidance's own error types)
                    self._ll_error = f"llguidance cannot read this tokenizer: {exc}"
            if self._ll_tokenizer is None:
                raise ValueError(self._ll_error)
            return self._ll_tokenizer

    def warm(self) -> None:
        """Make ``ll_tokenizer`` on a thread of its own now (the engine calls this once it
        is ready, so its start does not wait for it; a compile before it is done waits).
        A tokenizer llguidance cannot parse is logged here; constrained requests then fail
        with the same message."""

        def run() -> None:
            try:
                _ = self.ll_tokenizer
            except ValueError as exc:
                logger.warning("%s: constrained requests will fail", exc)

        threading.Thread(target=run, name="llguidance-tokenizer", daemon=True).start()

    # ------------------------------------------------------------------- spec -> grammar

    def to_grammar(self, spec: ConstraintSpec) -> str:
        """The llguidance grammar (JSON text) of a spec; ValueError names the problem."""
        kind, value = spec.kind, spec.value
        if kind == "regex":
            if not isinstance(value, str) or not value:
                raise ValueError("regex must be a non-empty string")
            try:
                re.compile(value)
            except (re.error, RecursionError) as exc:  # (nesting past re's recursion)
                raise ValueError(f"invalid regex {value!r}: {exc}") from None
            return llg.LLMatcher.grammar_from_regex(value)
        if kind == "choices":
            return llg.grammar_from("choice", list(value))
        if kind == "dtype":
            if value not in specs.DTYPE_REGEX:
                raise ValueError(f"unknown dtype {value!r}")
            return llg.LLMatcher.grammar_from_regex(specs.DTYPE_REGEX[value])
        if kind == "json_schema":
            return self._schema_grammar(spec)
        if kind == "ebnf":
            return ebnf_grammar(value)
        if kind == "structural_tag":
            return structural_tag_grammar(value)
        raise ValueError(f"unknown constraint kind {kind!r}")

    def _schema_grammar(self, spec: ConstraintSpec) -> str:
        """Cheap checks (metaschema, whitespace pattern, keywords llguidance would ignore),
        then llguidance's own JSON compiler's grammar. The compiler's refusals surface when
        the matcher is built (``_build``), which then falls back to the regex translator."""
        schema = specs.load_json_schema(spec.value)  # (spec.value is normalized text)
        ws = spec.whitespace_pattern  # None: the default separators
        if ws is not None:
            check_whitespace_pattern(ws)
        meta_check(schema)
        # a keyword is a quoted key in the text (unless spelled with \u escapes): skip the
        # walk when none can be there
        text = spec.value if isinstance(spec.value, str) else json.dumps(schema)
        bad = unenforced_keywords(schema) if "\\u" in text or any(
            f'"{k}"' in text for k in UNREPORTED_KEYWORDS) else []
        if bad:
            raise ValueError(f"unsupported JSON Schema keyword {bad[0]}")
        style = ({"whitespace_pattern": ws} if ws is not None else
                 dict(zip(("item_separator", "key_separator"), DEFAULT_SEPARATORS)))
        # handed over as text: llguidance parses it faster than it converts a dict (4.5
        # against 5.8 ms for o50639's 224 KB; the same grammar for all 200 sample schemas)
        prepared = json.dumps(prepare_schema(schema), ensure_ascii=False, separators=(",", ":"))
        return llg.LLMatcher.grammar_from_json_schema(prepared, defaults={
            "whitespace_flexible": False, **style, "lenient": False})

    def _translated(self, spec: ConstraintSpec, why: str) -> str:
        """Where llguidance refuses a schema (non-disjoint ``oneOf``, ``not``,
        ``dependencies``, ...): the project's sound schema -> regex translator
        (``schema.regex_translator``, the outlines backend's) as a regex grammar. Runs on a
        compile worker."""
        schema = specs.load_json_schema(spec.value)
        ws = spec.whitespace_pattern
        try:
            # validate() already checked the metaschema (jsonschema's own walk costs ~50 ms
            # on large schemas): only the draft's validator class is needed here
            cls = jsonschema.validators.validator_for(schema)
            regex = SchemaTranslator(schema, cls, ws,
                                     max_regex_chars=self.max_regex_chars).translate()
        except ValueError as exc:
            raise ValueError(f"unsupported json_schema: {why} (regex translation: {exc})") \
                from None
        return llg.LLMatcher.grammar_from_regex(regex)

    def validate(self, spec: ConstraintSpec) -> None:
        """Cheap synchronous checks (no lexer or matcher is built here): JSON schemas as in
        ``_schema_grammar``; other kinds' grammar syntax by ``validate_grammar``."""
        if self._checked.get(spec) is not None:
            return
        grammar = self.to_grammar(spec)
        if spec.kind != "json_schema":
            err = llg.LLMatcher.validate_grammar(grammar, None, limits=self.limits)
            if err:
                raise ValueError(f"invalid {spec.kind}: {_short(err)}")
        self._checked.put(spec, (grammar, self._cache_key(grammar)))

    def _cache_key(self, grammar: str) -> str:
        return cache_key("llguidance", grammar, self.vocab.tokenizer_hash, self.vocab_size,
                         self.eos_ids)

    # -------------------------------------------------------------------------- compiling

    def _build(self, grammar: str, spec: ConstraintSpec) -> Compiled:
        """Runs on a worker thread (the matcher build drops the GIL)."""
        t0 = time.perf_counter()
        kwargs = {"limits": self.limits} if self.limits is not None else {}
        matcher = llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0, **kwargs)
        if matcher.is_error() and spec.kind == "json_schema":
            grammar = self._translated(spec, _short(matcher.get_error()))
            matcher = llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0, **kwargs)
        if matcher.is_error():
            raise ValueError(f"invalid {spec.kind}: {_short(matcher.get_error())}")
        first = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        if matcher.is_error() and not matcher.get_error().startswith("NoExtension"):
            raise ValueError(_short(matcher.get_error()))
        if matcher.is_error() or (not first.any() and not matcher.is_accepting()):
            raise ValueError("grammar matches no string this tokenizer can produce "
                             "(empty language)")
        with self._lock:
            self._stats["compiles"] += 1
            self._stats["compile_time_s"] += time.perf_counter() - t0
        return Compiled(matcher, grammar)

    def compile(self, spec: ConstraintSpec) -> LLGuidanceGrammar:
        """Synchronous compile (tests, benchmarks); the scheduler uses ``compile_async``."""
        return self.compile_async(spec).result()

    def compile_async(self, spec: ConstraintSpec) -> Future[Grammar]:
        out: Future[Grammar] = Future()
        try:
            checked = self._checked.get(spec)
            grammar = checked[0] if checked else self.to_grammar(spec)
        except ValueError as exc:
            self._fail(out, exc)
            return out
        key = checked[1] if checked else self._cache_key(grammar)
        return self._serve(out, key, lambda: self._build(grammar, spec),
                           lambda c: LLGuidanceGrammar(self, c, c.matcher.deep_copy()))

    # ------------------------------------------------------------------------- closing

    def spell_token(self, token_id: int) -> bytes:
        return self.vocab.id_to_bytes.get(token_id, b"")

    def spell_close(self, m: llg.LLMatcher, data: bytes) -> list[int] | None:
        """Tokens spelling ``data`` that ``m``'s mask allows one by one and after which it
        accepts (``TokenVocab.spell``: the mask, not only what ``m`` would consume: where the
        grammar forces bytes, llguidance's mask keeps only their canonical token). None when
        no allowed token starts what is left, or ``m`` does not accept at the end. ``m`` is
        left where it was."""
        took: list[int] = []

        def take(token: int) -> bool:
            if m.try_consume_tokens([token]) != 1:
                return False
            took.append(token)
            return True

        try:
            ids = self.vocab.spell(data, lambda: self.mask_of(m), take)
            return ids if ids is not None and (m.is_accepting() or m.is_stopped()) else None
        finally:
            if took:
                m.rollback(len(took))

    def mask_of(self, m: llg.LLMatcher) -> np.ndarray:
        """``m``'s token mask now: int32 words, bit t of word t // 32 for token t."""
        row = np.zeros((1, self.words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr([(m, 0)], row.ctypes.data, self.words * 4, 1)
        return row[0]

    # ------------------------------------------------------------------------------ masks

    def fill_rows(self, rows: list[tuple[LLGuidanceGrammar, int]], bitmask: np.ndarray) -> None:
        """Masks of many matchers at once, in parallel and off the GIL."""
        if bitmask.dtype != np.int32 or not bitmask.flags["C_CONTIGUOUS"] \
                or bitmask.shape[1] != self.words:
            raise ValueError(f"bitmask must be C-contiguous int32 [B, {self.words}]")
        self._executor.unsafe_compute_mask_ptr([(g.m, row) for g, row in rows],
                                               bitmask.ctypes.data, self.words * 4,
                                               bitmask.shape[0])

    def fill_bitmasks(self, rows: list[tuple[Grammar, int]], bitmask: np.ndarray) -> None:
        live = []
        for g, row in rows:
            if isinstance(g, LLGuidanceGrammar) and not g.is_terminated():
                live.append((g, row))
            else:
                g.fill_bitmask(bitmask, row)
        if live:
            self.fill_rows(live, bitmask)
            for g, row in live:  # out of budget: let sampling run; accept_token then fails
                if g.m.is_error():
                    bitmask[row] = -1


def _short(msg: str, limit: int = 600) -> str:
    """llguidance errors can quote the whole grammar: keep the head."""
    msg = msg.strip()
    return msg if len(msg) <= limit else msg[:limit] + " ..."
