"""The engine's grammar backend, made on a thread of its own after the engine is ready.

Made beside the weights, its Python (the constraints' imports, the vocabulary's bytes) held
the GIL between the placement's C calls: 0.3-0.8 s of a 1B GGUF's start on 2 cores. After
ready nothing waits for it but a constrained request (or one under a reasoning parser) in
the first second or so, which ``state`` holds until it is made.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

logger = logging.getLogger(__name__)


def make_backend(tokenizer, config, eos_ids, vocab_size: int):
    """The config's grammar backend for ``tokenizer`` over ``vocab_size`` logits."""
    from radixlm.constraints import create_grammar_backend

    return create_grammar_backend(
        tokenizer, vocab_size=vocab_size, eos_token_ids=eos_ids,
        backend=config.grammar_backend, enable_jump_forward=config.enable_jump_forward,
        max_workers=config.grammar_compile_workers)


def in_background(fn, *args) -> Future:
    """``fn(*args)`` run in a thread of its own; its result or exception in the future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001  # (handed to whoever takes the result)
            future.set_exception(e)

    threading.Thread(target=run, name="radixlm-setup", daemon=True).start()
    return future


class GrammarSetup:
    """Starts making the backend for ``vocab_size`` logits (the weights') at once;
    ``backend`` / ``reasoning`` / ``error`` wait for it the first time. ``scheduler`` gets
    the backend then (only constrained requests, which come through the engine's checks
    first, use it there)."""

    def __init__(self, tokenizer, config, eos_ids, vocab_size: int, scheduler) -> None:
        self._config, self._scheduler = config, scheduler
        self._lock = threading.Lock()
        self._parts: tuple | None = None
        self._future = in_background(self._make, tokenizer, config, eos_ids, vocab_size)

    @staticmethod
    def _make(tokenizer, config, eos_ids, vocab_size: int):
        backend = make_backend(tokenizer, config, eos_ids, vocab_size)
        backend.warm()  # (llguidance parses its tokenizer tables on a thread of its own)
        return backend

    def state(self) -> tuple:
        """(backend or None, grammar-after-reasoning wrappers or None, why there is no
        backend or None)."""
        with self._lock:
            if self._parts is None:
                self._parts = self._resolve()
                backend = self._parts[0]
                self._scheduler.grammar_backend = backend
                self._scheduler.speculation.grammar_backend = backend
            return self._parts

    def _resolve(self) -> tuple:
        try:
            backend = self._future.result()
        except ImportError as e:  # constraints package not available
            return None, None, e
        except ValueError as e:  # e.g. a tokenizer larger than the model's vocabulary
            logger.warning("constrained decoding unavailable for this model: %s", e)
            return None, None, e
        reasoning = None
        if self._config.reasoning_parser is not None:
            from radixlm.constraints.after_reasoning import ReasoningGrammars

            reasoning = ReasoningGrammars(backend, self._config.reasoning_parser,
                                          self._config.enable_strict_thinking)
        return backend, reasoning, None

    @property
    def backend(self):
        return self.state()[0]

    @property
    def reasoning(self):
        return self.state()[1]

    @property
    def error(self) -> Exception | None:
        return self.state()[2]
