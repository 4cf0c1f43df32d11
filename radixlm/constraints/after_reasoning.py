"""Grammar after reasoning: a request's constraint (regex, JSON schema, EBNF, tool grammar)
applies from the end of the model's thinking block, never inside it, and a thinking budget
ends the block after that many tokens.

``AfterReasoningGrammar`` wraps a request's grammar (or none: a budget alone) behind the
``Grammar`` interface, so the sampler's mask, the postprocessor's accept / jump-forward and a
speculative verifier's accept / rollback see the boundary without knowing of it. Phases:

Where the wrapper starts is where the output starts (``reasoning.output_start``): in
``REASONING``, in ``ANSWER`` (the prompt closed the block: the inner grammar from the first
token), or in

- ``OPENING`` (the output may begin a block: formats that are not forced): allowed are the
  inner grammar's tokens and those that begin the start tag; once a token begins the tag,
  only its continuation; a token the inner grammar takes starts the answer (no block).
- ``REASONING``: free text. The end tag is found in the bytes of the tokens (however the
  tokenizer splits it: one added token, ``</`` ``think`` ``>``, ...), by a KMP automaton
  carried across tokens. Forbidden, and only these: with an inner grammar, a token that
  completes the end tag and runs on past it (its tail would be answer text the grammar never
  saw; the model can write the same text with the tag's last piece alone) and EOS (an empty
  answer), unless the inner grammar accepts the empty string; under strict thinking, the
  format's excluded tokens (end of turn, tool-call tags; SGLang's ``--enable-strict-thinking``).
- ``CLOSING``: ``thinking_budget`` tokens of the block are spent. The mask allows only the
  next token of the end tag (its remainder, when the model had begun writing it), and
  ``jump_forward`` returns the whole remainder as a forced continuation when jump-forward is
  on: one extend step instead of one decode step per token.
- ``ANSWER``: the inner grammar, from its first token (its own jump-forward included). Under
  strict thinking without an inner grammar, the answer's first token may not be EOS.

The budget counts the tokens of the thinking block before its end tag (a start tag the model
writes itself is not counted; its leading start tags after a forced start are). Jump-forward
never fires in ``OPENING`` or ``REASONING``.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from radixlm.constraints import reasoning as rs
from radixlm.constraints.base import Grammar, JumpForward
from radixlm.constraints.reasoning import ReasoningFormat, get_format, output_start, prompt_tail
from radixlm.constraints.specs import ConstraintSpec
from radixlm.constraints.vocab import TokenVocab, allows


def _kmp_table(tag: bytes) -> list[int]:
    """fail[i]: length of the longest proper prefix of tag[:i + 1] that is also its suffix."""
    fail, k = [0] * len(tag), 0
    for i in range(1, len(tag)):
        while k and tag[i] != tag[k]:
            k = fail[k - 1]
        if tag[i] == tag[k]:
            k += 1
        fail[i] = k
    return fail


class ThinkingVocab:
    """What the wrappers of one (tokenizer, format) share, built once: the tags' bytes, the
    end tag's KMP table, and bitmask rows (int32 words, ``words`` per row)."""

    def __init__(self, tokenizer, vocab: TokenVocab, vocab_size: int, eos_ids,
                 fmt: ReasoningFormat) -> None:
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.vocab = vocab
        self.id_to_bytes = vocab.id_to_bytes
        self.vocab_size = int(vocab_size)
        self.words = (self.vocab_size + 31) // 32
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.start = fmt.start.encode()
        self.end = fmt.end.encode()
        self.fail = _kmp_table(self.end)
        self.eos_row = self.row(self.eos_ids)
        self.excluded_ids = frozenset(self._single_token_ids(fmt.excluded))
        self._rows: dict[tuple, np.ndarray] = {}
        self._close: dict[int, tuple[int, ...]] = {}
        last = self.end[-1:]
        # tokens that may complete the end tag before their last byte (checked per state)
        self._cross_candidates = [t for t, b in self.id_to_bytes.items() if last in b[:-1]]
        self._by_first_byte: dict[int, list[int]] = {}
        for t, b in self.id_to_bytes.items():
            self._by_first_byte.setdefault(b[0], []).append(t)
        self.close_tokens(0)  # fails here (at startup) if the end tag cannot be written

    def _single_token_ids(self, texts: tuple[str, ...]) -> list[int]:
        """Ids of the texts the tokenizer writes as one token (others are not excluded: their
        pieces are ordinary text)."""
        out = []
        for text in texts:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == 1 and 0 <= ids[0] < self.vocab_size:
                out.append(int(ids[0]))
        return out

    def row(self, ids) -> np.ndarray:
        """A bitmask row with exactly ``ids`` set."""
        bits = np.zeros(self.words * 32, dtype=np.bool_)
        idx = [i for i in ids if 0 <= i < self.vocab_size]
        bits[idx] = True
        return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)

    def advance(self, state: int, data: bytes) -> tuple[int, int]:
        """Run the end-tag automaton from ``state`` over ``data``: (state after it, or 0 on a
        match; the index just past the first complete end tag in ``data``, or -1)."""
        end, fail = self.end, self.fail
        for i, byte in enumerate(data):
            while state and end[state] != byte:
                state = fail[state - 1]
            if end[state] == byte:
                state += 1
            if state == len(end):
                return 0, i + 1
        return state, -1

    def reasoning_row(self, state: int, eos_ok: bool, no_cross: bool,
                      strict: bool) -> np.ndarray:
        """Allowed tokens inside the thinking block at end-tag state ``state`` (see the module
        docstring for what is forbidden)."""
        key = ("reason", state, eos_ok, no_cross, strict)
        row = self._rows.get(key)
        if row is None:
            banned = set() if eos_ok else set(self.eos_ids)
            if strict:
                banned |= self.excluded_ids
            if no_cross:
                for t in self._cross_candidates:
                    b = self.id_to_bytes[t]
                    done = self.advance(state, b)[1]
                    if 0 <= done < len(b):
                        banned.add(t)
            row = ~self.row(banned)
            self._rows[key] = row
        return row

    def start_compatible(self, matched: int, data: bytes | None) -> bool:
        """Whether a token spelling ``data`` continues the start tag after ``matched`` bytes
        (it may run on past the tag: its tail is reasoning)."""
        rest = self.start[matched:]
        return bool(data) and (rest.startswith(data) or data.startswith(rest))

    def start_row(self, matched: int) -> np.ndarray:
        """Tokens that continue the start tag after ``matched`` bytes of it."""
        key = ("start", matched)
        row = self._rows.get(key)
        if row is None:
            first = self.start[matched]
            row = self.row(t for t in self._by_first_byte.get(first, ())
                           if self.start_compatible(matched, self.id_to_bytes[t]))
            self._rows[key] = row
        return row

    def single_row(self, token: int) -> np.ndarray:
        key = ("one", token)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self.row([token])
        return row

    def close_tokens(self, state: int) -> tuple[int, ...]:
        """Tokens that finish the end tag from automaton state ``state`` (its remainder, else
        the whole tag), each allowed by the block's mask where it is written and ending the
        match no earlier than the last; ValueError when the tokenizer cannot write it."""
        cached = self._close.get(state)
        if cached is not None:
            return cached
        for text in (self.end[state:], self.end):
            ids = self._spell_end(state, text)
            if ids is not None and self._closes(state, ids):
                self._close[state] = ids
                return ids
        raise ValueError(f"the tokenizer cannot write the end of thinking {self.fmt.end!r}")

    def _spell_end(self, state: int, text: bytes) -> tuple[int, ...] | None:
        """``text`` in tokens from end-tag state ``state``, each allowed by the block's
        strictest mask (strict thinking's exclusions, no token running past the tag) in the
        state it is written at: the tokenizer's own tokens, else ``TokenVocab.spell``'s."""
        at = [state]

        def mask() -> np.ndarray:
            return self.reasoning_row(at[0], False, True, True)

        def take(token: int) -> bool:
            at[0] = self.advance(at[0], self.id_to_bytes[token])[0]
            return True

        return self._spell(text, mask, take, lambda: at.__setitem__(0, state))

    def spell_start(self, matched: int) -> tuple[int, ...] | None:
        """The start tag's rest after ``matched`` bytes of it, each token allowed by the
        opening mask where it is written (``start_row``)."""
        at = [matched]

        def take(token: int) -> bool:
            at[0] += len(self.id_to_bytes[token])
            return True

        return self._spell(self.start[matched:], lambda: self.start_row(at[0]), take,
                           lambda: at.__setitem__(0, matched))

    def _spell(self, text: bytes, mask, take, reset) -> tuple[int, ...] | None:
        """``text`` in tokens ``mask()`` allows one by one, ``take`` advancing the state
        (``reset`` puts it back): the tokenizer's own tokens when they spell ``text``
        exactly and pass, else ``TokenVocab.spell``'s (with the same mask check)."""
        try:
            own = self.tokenizer.encode(text.decode("utf-8"), add_special_tokens=False)
        except UnicodeDecodeError:
            own = []
        if (own and b"".join(self.id_to_bytes.get(t, b"\x00\xff") for t in own) == text
                and all(allows(mask(), t) and take(t) for t in own)):
            return tuple(int(t) for t in own)
        reset()
        ids = self.vocab.spell(text, mask, take)
        return None if ids is None else tuple(ids)

    def _closes(self, state: int, ids: tuple[int, ...]) -> bool:
        for i, t in enumerate(ids):
            data = self.id_to_bytes[t]
            state, done = self.advance(state, data)
            if done >= 0:
                return i == len(ids) - 1 and done == len(data)
        return False


class AfterReasoningGrammar(Grammar):
    """A request's grammar that starts at the end of the thinking block (module docstring).
    ``inner``: the answer's grammar, or None (only the budget / strict thinking); ``start``:
    where the output starts (``reasoning.REASONING``, ``OPENING`` or ``ANSWER``);
    ``budget``: the most tokens the block may hold before its end tag (None: no limit);
    ``eos_ends``: whether EOS ends the output when there is no inner grammar (False for a
    request with ignore_eos: EOS is then one more token of the text)."""

    OPENING, REASONING, CLOSING, ANSWER = range(4)

    def __init__(self, shared: ThinkingVocab, inner: Grammar | None, start: str,
                 budget: int | None = None, strict: bool = False,
                 eos_ends: bool = True) -> None:
        self.s = shared
        self.eos_ends = eos_ends
        self.inner = inner
        self.budget = budget
        self.strict = strict
        in_reasoning = start == rs.REASONING
        self.phase = {rs.REASONING: self.REASONING, rs.OPENING: self.OPENING,
                      rs.ANSWER: self.ANSWER}[start]
        self.matched = 0  # start-tag bytes written (OPENING)
        self.kmp = 0  # end-tag automaton state (REASONING)
        self.thought = 0  # tokens of the block counted against the budget
        self.close: tuple[int, ...] = ()  # the end tag's tokens to force (CLOSING)
        self.closed = 0  # of which written
        self.had_block = in_reasoning
        self.answer_len = 0
        self.eos_done = False  # EOS taken without an inner grammar
        self._empty_ok: bool | None = None  # the inner grammar accepts an empty answer
        self._history: list[tuple[tuple, bool]] = []  # per token: (state before, fed inner)
        if in_reasoning:
            self._check_budget()

    # ------------------------------------------------------------------ state
    def _state(self) -> tuple:
        return (self.phase, self.matched, self.kmp, self.thought, self.close, self.closed,
                self.had_block, self.answer_len, self.eos_done)

    def _restore(self, state: tuple) -> None:
        (self.phase, self.matched, self.kmp, self.thought, self.close, self.closed,
         self.had_block, self.answer_len, self.eos_done) = state

    def _check_budget(self) -> None:
        if self.budget is not None and self.thought >= self.budget:
            self.phase = self.CLOSING
            self.close, self.closed = self.s.close_tokens(self.kmp), 0

    def _eos_ok(self) -> bool:
        """EOS inside the block ends the output with an empty answer: only when the inner
        grammar (if any) accepts that."""
        if self.inner is None:
            return True
        if self._empty_ok is None:
            accepting = getattr(self.inner, "is_accepting", None)
            if accepting is not None:
                self._empty_ok = bool(accepting())
            else:
                probe = np.zeros((1, self.s.words), dtype=np.int32)
                self.inner.fill_bitmask(probe, 0)
                self._empty_ok = bool((probe[0] & self.s.eos_row).any())
        return self._empty_ok

    @property
    def in_answer(self) -> bool:
        return self.phase == self.ANSWER

    # ------------------------------------------------------------------ Grammar
    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        s = self.s
        if self.phase == self.OPENING:
            if self.matched:
                bitmask[row] = s.start_row(self.matched)
                return
            self._fill_answer(bitmask, row)
            if self.budget != 0:
                bitmask[row] |= s.start_row(0)
        elif self.phase == self.REASONING:
            bitmask[row] = s.reasoning_row(self.kmp, self._eos_ok(), self.inner is not None,
                                           self.strict)
        elif self.phase == self.CLOSING:
            bitmask[row] = s.single_row(self.close[self.closed])
        else:
            self._fill_answer(bitmask, row)

    def _fill_answer(self, bitmask: np.ndarray, row: int) -> None:
        if self.inner is not None:
            self.inner.fill_bitmask(bitmask, row)
            if self.error() is not None:  # out of budget: sampling runs, accept then fails
                bitmask[row] = -1
        elif self.eos_done:
            bitmask[row] = self.s.eos_row
        else:
            bitmask[row] = -1
            if self.strict and self.had_block and not self.answer_len:
                bitmask[row] &= ~self.s.eos_row

    def accept_token(self, token_id: int) -> bool:
        before = self._state()
        phase, token_id = self.phase, int(token_id)
        if phase == self.OPENING:
            fed = self._accept_opening(token_id)
        elif phase == self.REASONING:
            fed = self._accept_reasoning(token_id)
        elif phase == self.CLOSING:
            fed = False
            if token_id != self.close[self.closed]:
                return False
            self.closed += 1
            if self.closed == len(self.close):
                self.phase = self.ANSWER
        else:
            fed = self._accept_answer(token_id)
        if fed is None:  # refused: nothing changed
            self._restore(before)
            return False
        self._history.append((before, fed))
        return True

    def _accept_opening(self, token_id: int) -> bool | None:
        data = self.s.id_to_bytes.get(token_id)
        if self.budget != 0 and self.s.start_compatible(self.matched, data):
            rest = len(self.s.start) - self.matched
            if len(data) < rest:
                self.matched += len(data)
                return False
            self.phase, self.matched, self.had_block = self.REASONING, 0, True
            tail = data[rest:]
            if tail:  # the token runs on into the block: count it as a reasoning token
                return self._reason_bytes(tail)
            self._check_budget()
            return False
        if self.matched:  # the start tag was begun: only its continuation
            return None
        return self._accept_answer(token_id)

    def _accept_reasoning(self, token_id: int) -> bool | None:
        if self.strict and token_id in self.s.excluded_ids:
            return None
        if token_id in self.s.eos_ids and (self.inner is not None or self.eos_ends):
            # the output ends inside the block
            if not self._eos_ok():
                return None
            self.phase = self.ANSWER
            if self.inner is None:
                self.eos_done = True
                return False
            return self._accept_answer(token_id)
        return self._reason_bytes(self.s.id_to_bytes.get(token_id, b""))

    def _reason_bytes(self, data: bytes) -> bool | None:
        state, done = self.s.advance(self.kmp, data)
        if done >= 0:
            if done < len(data) and self.inner is not None:
                return None  # would carry answer text past the tag
            self.phase, self.kmp = self.ANSWER, 0
            return False
        self.kmp = state
        self.thought += 1
        self._check_budget()
        return False

    def _accept_answer(self, token_id: int) -> bool | None:
        self.phase = self.ANSWER
        is_eos = token_id in self.s.eos_ids
        if self.inner is None:
            if self.eos_done or (is_eos and self.strict and self.had_block
                                 and not self.answer_len):
                return None
            self.eos_done = is_eos and self.eos_ends
            self.answer_len += 1
            return False
        if not self.inner.accept_token(token_id):
            return None
        self.answer_len += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens > len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} of {len(self._history)} tokens")
        if not num_tokens:
            return
        fed = 0
        for _ in range(num_tokens):
            before, was_fed = self._history.pop()
            fed += was_fed
        self._restore(before)
        if fed:
            self.inner.rollback(fed)  # type: ignore[union-attr]

    def is_terminated(self) -> bool:
        if self.phase != self.ANSWER:
            return False
        return self.inner.is_terminated() if self.inner is not None else self.eos_done

    def is_accepting(self) -> bool:
        if self.phase != self.ANSWER:
            return self.phase in (self.OPENING, self.REASONING) and self._eos_ok() \
                and not self.matched
        if self.inner is None:
            return True
        accepting = getattr(self.inner, "is_accepting", None)
        return bool(accepting()) if accepting is not None else self.inner.is_terminated()

    def error(self) -> str | None:
        """The inner grammar's error (e.g. a mask budget ran out), or None."""
        err = getattr(self.inner, "error", None)
        return err() if err is not None else None

    def jump_forward(self, output_ids: list[int]) -> JumpForward | None:
        """The rest of the end tag once the budget is spent; the inner grammar's own
        forced text in the answer; nothing inside the thinking block."""
        if self.phase == self.CLOSING:
            ids = list(self.close[self.closed:])
            for _ in ids:
                self._history.append((self._state(), False))
                self.closed += 1
            self.phase = self.ANSWER
            text = b"".join(self.s.id_to_bytes.get(t, b"") for t in ids)
            return JumpForward(0, ids, text.decode("utf-8", "replace"))
        if self.phase != self.ANSWER or self.inner is None:
            return None
        plan = self.inner.jump_forward(output_ids)
        if plan is None:
            return None
        for _ in range(plan.rollback):  # the inner grammar rolled these back itself
            self._history.pop()
        self.answer_len -= plan.rollback
        for _ in plan.token_ids:
            self._history.append((self._state(), True))
            self.answer_len += 1
        return plan

    def close_fits(self, room: int) -> bool:
        if self.phase == self.ANSWER and self.inner is not None:
            return self.inner.close_fits(room)
        return super().close_fits(room)

    def close_tokens(self) -> list[int] | None:
        """The answer's close; inside the thinking block the rest of the end tag (the start
        tag's rest first, once begun) and then the answer's close from its start."""
        if self.phase == self.ANSWER:
            return self.inner.close_tokens() if self.inner is not None else []
        if self.inner is None:
            return None
        inner = self.inner.close_tokens()  # the inner grammar has not started yet
        if inner is None:
            return None
        if self.phase == self.CLOSING:
            return list(self.close[self.closed:]) + inner
        if self.phase == self.REASONING:
            return list(self.s.close_tokens(self.kmp)) + inner
        if not self.matched:  # OPENING: the answer may start right away
            return inner
        rest = self.s.spell_start(self.matched)
        return None if rest is None else list(rest) + list(self.s.close_tokens(0)) + inner

    def copy(self) -> AfterReasoningGrammar:
        g = AfterReasoningGrammar(self.s, self.inner.copy() if self.inner is not None else None,
                                  rs.OPENING, self.budget, self.strict, self.eos_ends)
        g._restore(self._state())
        g._empty_ok = self._empty_ok
        g._history = list(self._history)
        return g


@dataclass(frozen=True)
class ReasoningSpec:
    """What a request's wrapper is built from: its constraint (None: none), where its output
    starts (``reasoning.output_start``), its budget (None: no limit), whether EOS ends it
    (not with ignore_eos)."""

    inner: ConstraintSpec | None
    start: str
    budget: int | None = None
    eos_ends: bool = True


class ReasoningGrammars:
    """Makes the per-request wrappers of one engine: its grammar backend (which compiles the
    inner grammars), one reasoning format, strict thinking on or off. Building it fails
    (ValueError) when the tokenizer cannot write the format's end tag."""

    def __init__(self, backend, fmt: ReasoningFormat | str, strict: bool = False) -> None:
        self.backend = backend
        self.fmt = get_format(fmt) if isinstance(fmt, str) else fmt
        self.strict = strict
        self.shared = ThinkingVocab(backend.tokenizer, backend.vocab, backend.vocab_size,
                                    backend.eos_ids, self.fmt)

    def needed(self, has_constraint: bool, budget: int | None) -> bool:
        """Whether a request needs a wrapper (a constraint, a budget, or strict thinking)."""
        return has_constraint or budget is not None or self.strict

    def plan(self, inner: ConstraintSpec | None, tokenizer, prompt_ids: list[int],
             budget: int | None, eos_ends: bool = True) -> ReasoningSpec:
        """The spec of a request whose prompt is ``prompt_ids`` (where its output starts:
        ``reasoning.output_start`` of the prompt's tail)."""
        return ReasoningSpec(inner, output_start(self.fmt, prompt_tail(tokenizer, prompt_ids)),
                             budget, eos_ends)

    def compile_async(self, spec: ReasoningSpec) -> Future[Grammar]:
        """A future of the request's wrapper: around the inner grammar once the backend has
        compiled it (failing as that compile fails), or around none at once."""
        out: Future[Grammar] = Future()

        def make(grammar: Grammar | None) -> None:
            wrapper = AfterReasoningGrammar(self.shared, grammar, spec.start, spec.budget,
                                            self.strict, spec.eos_ends)
            try:
                out.set_result(wrapper)
            except Exception:  # noqa: BLE001 - cancelled meanwhile (the request ended)
                pass

        def relay(f: Future) -> None:
            if f.cancelled():
                out.cancel()
                return
            exc = f.exception()
            if exc is not None:
                try:
                    out.set_exception(exc)
                except Exception:  # noqa: BLE001 - cancelled meanwhile
                    pass
                return
            make(f.result())

        if spec.inner is None:
            make(None)
        else:
            self.backend.compile_async(spec.inner).add_done_callback(relay)
        return out
