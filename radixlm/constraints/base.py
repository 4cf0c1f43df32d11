"""The grammar-backend interface the scheduler and sampler talk to.

A *spec* says what a request's output must match (exactly one kind per request):
``ConstraintSpec(kind="regex" | "json_schema" | "choices" | "dtype" | "ebnf" |
"structural_tag", value=...)`` (the last two on the llguidance backend only). A backend
compiles a spec once per (spec, tokenizer) into a shared, immutable compiled form, and
hands each request a cheap per-request ``Grammar`` state.

Life of a constrained request, as the runtime drives it:

1. ``backend.validate(spec)`` on the caller's thread before the request is queued: cheap
   checks (JSON parses, schema is a valid JSON Schema, no unsupported keyword, regex
   syntax). Raises ``ValueError`` naming the problem.
2. ``backend.compile_async(spec)`` returns a ``concurrent.futures.Future[Grammar]``;
   compilation runs on a thread pool, never on the scheduler thread. A failed future
   (budget exceeded, empty language) fails only that request.
3. Each step: ``grammar.fill_bitmask(bitmask, row)`` writes row ``row`` of an int32 numpy
   array ``[batch, ceil(vocab_size / 32)]`` (bit ``j % 32`` of word ``j // 32`` set means
   token ``j`` is allowed). EOS ids are allowed only in accepting states.
4. After sampling: ``grammar.accept_token(token_id)``. EOS is accepted in accepting
   states without advancing. ``is_terminated()`` is true once EOS was accepted or no
   further token can be produced.
5. Jump-forward: ``grammar.jump_forward(output_ids)`` may return a ``JumpForward`` plan
   (drop the last ``rollback`` output tokens, append ``token_ids``); the grammar state has
   already been advanced over the plan when it is returned.
6. Closing within a budget (``complete_within_max_tokens``): ``grammar.close_tokens()`` is
   a short list of tokens that, accepted one by one from the current state, end in an
   accepting state (``[]`` when accepting already); its length bounds the fewest from
   above. None: the grammar cannot compute one (the outlines backend) or found none.
   ``grammar.close_fits(room)`` after each token: whether a close of at most ``room``
   tokens is known; the grammar keeps that close, so that after ``rollback(1)`` to this
   state ``close_tokens()`` returns it (or another no longer).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixlm.constraints.cache import LRUCache

# The spec types are defined with the specs (plain Python, the frontend imports them) and
# are importable from here as well.
from radixlm.constraints.specs import (  # noqa: F401
    CONSTRAINT_KINDS,
    DEFAULT_SEPARATORS,
    ConstraintSpec,
)
from radixlm.constraints.vocab import TokenVocab

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class JumpForward:
    """Forced continuation: drop the last ``rollback`` output tokens, then append
    ``token_ids`` (``text`` is what they spell, for metrics and logs)."""

    rollback: int
    token_ids: list[int]
    text: str


class Grammar(ABC):
    """Per-request automaton state. Not thread-safe; owned by the scheduler thread."""

    @abstractmethod
    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed-token bits of the current state into ``bitmask[row]``."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance over ``token_id``. Returns False (state unchanged) if not allowed."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once EOS was accepted or the automaton can go no further."""

    def jump_forward(self, output_ids: list[int]) -> JumpForward | None:
        """A forced continuation from the current state, or None (default: none)."""
        return None

    def close_tokens(self) -> list[int] | None:
        """Tokens that finish a valid document from here (module docstring, 6); None when
        this grammar cannot tell (default)."""
        return None

    def close_fits(self, room: int) -> bool:
        """Whether a close of at most ``room`` tokens is known from here (module docstring,
        6). Default: ``close_tokens()``'s length, for grammars whose close depends on the
        state alone; a grammar that keeps closes across tokens overrides it (cheaper)."""
        close = self.close_tokens()
        return close is not None and len(close) <= room

    @abstractmethod
    def copy(self) -> Grammar:
        """A fresh state at the same position (for ``n`` parallel samples, retraction)."""


class GrammarBackend(ABC):
    """Compiles specs for one tokenizer; caches compiled grammars."""

    @abstractmethod
    def validate(self, spec: ConstraintSpec) -> None:
        """Cheap synchronous checks; raise ``ValueError`` naming the problem."""

    @abstractmethod
    def compile_async(self, spec: ConstraintSpec) -> Future[Grammar]:
        """Compile (or fetch from cache) off the calling thread; the future yields a fresh
        per-request ``Grammar`` or raises ``ValueError`` with a clear message."""

    def fill_bitmasks(self, rows: list[tuple[Grammar, int]], bitmask: np.ndarray) -> None:
        """Fill ``bitmask[row]`` for every ``(grammar, row)`` of one step (default: one by
        one; a backend may fill them in parallel)."""
        for grammar, row in rows:
            grammar.fill_bitmask(bitmask, row)

    def warm(self) -> None:  # noqa: B027
        """Start, off the calling thread, what the first compile would otherwise make
        (called once the engine is ready; default: nothing)."""

    def shutdown(self) -> None:  # noqa: B027
        """Release worker threads."""


class Deadlines:
    """Callbacks run at their deadlines by one daemon thread per process (started on first
    use): the compile budget of every request, without starting a timer thread per request
    (under load a thread start alone took up to ~7 ms)."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread does not survive a fork

    def _reset(self) -> None:
        self._heap: list[list] = []  # [deadline, seq, fn or None when cancelled, args]
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, fn: Callable, *args) -> Callable[[], None]:
        """Run ``fn(*args)`` on the deadline thread after ``delay_s``; returns ``cancel``."""
        entry = [time.monotonic() + delay_s, next(self._seq), fn, args]
        with self._cv:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="grammar-deadlines",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

        def cancel() -> None:
            entry[2] = None  # dropped when it reaches the top of the heap

        return cancel

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, fn, args = heapq.heappop(self._heap)
                        break
                    self._cv.wait(self._heap[0][0] - now if self._heap else None)
            if fn is None:  # cancelled after it was taken off the heap
                continue
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one callback must not stop the others
                logger.exception("grammar deadline callback failed")


DEADLINES = Deadlines()


class CompilingBackend(GrammarBackend):
    """What both backends share: one tokenizer's vocabulary checked against the width of the
    logits (``vocab_size``), the EOS ids inside it, a compile thread pool, the ``memory``
    cache of compiled grammars, one build per key however many requests wait for it, a
    time budget per request, and counters (``counters``, then ``compile_time_s``)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids, *, max_workers: int,
                 compile_timeout_s: float, max_regex_chars: int, enable_jump_forward: bool,
                 memory: LRUCache, counters: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.vocab = TokenVocab.from_tokenizer(tokenizer)
        self.vocab_size = int(vocab_size)
        if self.vocab.id_to_bytes and max(self.vocab.id_to_bytes) >= self.vocab_size:
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's vocabulary")
        self.eos_ids = tuple(sorted({int(e) for e in eos_token_ids if 0 <= e < self.vocab_size}))
        if not self.eos_ids:
            raise ValueError("need at least one EOS token id inside vocab_size")
        self.words = (self.vocab_size + 31) // 32  # int32 words of one bitmask row
        self.compile_timeout_s = compile_timeout_s
        self.max_regex_chars = max_regex_chars
        self.enable_jump_forward = enable_jump_forward
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar-compile")
        self._memory = memory
        self._inflight: dict[str, Future] = {}  # key -> the build in flight for it
        self._lock = threading.Lock()
        self._stats: dict[str, float] = {**dict.fromkeys(counters, 0), "compile_time_s": 0.0}

    def stats(self) -> dict:
        with self._lock:
            return {**self._stats, "memory_cache_size": len(self._memory)}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _serve(self, out: Future, key: str, build: Callable[[], Any],
               make: Callable[[Any], Any]) -> Future:
        """Resolve ``out`` with ``make(compiled)`` for ``key``: from memory, else from the
        build already in flight for it, else from a new ``build()`` on the pool (one build
        per key however many requests wait), within the compile time budget."""
        cached = self._memory.get(key)
        if cached is not None:
            with self._lock:
                self._stats["memory_hits"] += 1
            out.set_result(make(cached))
            return out
        with self._lock:
            inner = self._inflight.get(key)
            created = inner is None
            if created:
                inner = self._pool.submit(build)
                self._inflight[key] = inner
        if created:  # outside the lock: a build that already ended runs _finish right here
            inner.add_done_callback(lambda f: self._finish(key, f))
        cancel_budget = self._start_budget(out)

        def relay(f: Future) -> None:
            cancel_budget()
            if out.done():
                return
            exc = f.exception()
            if exc is not None:
                self._fail(out, exc if isinstance(exc, ValueError) else ValueError(str(exc)))
                return
            try:
                out.set_result(make(f.result()))
            except Exception:  # noqa: BLE001 - lost a race with the timeout
                pass

        inner.add_done_callback(relay)
        return out

    def _start_budget(self, out: Future) -> Callable[[], None]:
        """Fail ``out`` once ``compile_timeout_s`` has passed; returns the cancel function."""
        return DEADLINES.call_later(self.compile_timeout_s, self._fail, out, ValueError(
            f"constraint compile exceeded the time budget of {self.compile_timeout_s} s"))

    def _finish(self, key: str, f: Future) -> None:
        """A build ended: it is no longer in flight; a success is cached."""
        with self._lock:
            self._inflight.pop(key, None)
        if f.exception() is None:
            self._memory.put(key, f.result())

    def _fail(self, out: Future, exc: Exception) -> None:
        """Fail a request's future once (a timeout and a build may race to resolve it)."""
        if out.done():
            return
        with self._lock:
            self._stats["failures"] += 1
        try:
            out.set_exception(exc)
        except Exception:  # noqa: BLE001 - already resolved
            pass
