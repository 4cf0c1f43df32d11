"""The interface every frontend backend implements, and the parts they share.

A backend turns one step of a program into calls on a model server: generate a continuation
of the program's text, stream it, score `select` choices, warm the prefix cache. It is handed
a `Prompt` (the text so far and the chat messages so far), never the interpreter itself.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.ir import SamplingParams

DEFAULT_TIMEOUT_S = 300.0


class BackendError(RuntimeError):
    """A backend call failed (server down, HTTP error, request rejected, timeout)."""


@dataclass(frozen=True)
class Prompt:
    """What a backend sees of a program state at one step."""

    text: str
    messages: list[dict[str, str]] = field(default_factory=list)
    cur_role: str | None = None
    role_content: str = ""  # text written so far inside the open role


@dataclass
class ChoiceScores:
    """Token logprobs of each choice's own tokens: `[(logprob, token_id, text), ...]`."""

    input_token_logprobs: list[list[tuple]]
    unconditional_token_logprobs: list[list[tuple]] | None = None
    meta_info: dict[str, Any] = field(default_factory=dict)


class Backend:
    """Base class of frontend backends.

    Subclasses implement `generate`, `generate_stream`, `score_choices`, `cache_prefix` and
    `get_chat_template`; the rest have working defaults. Every call either returns or raises
    `BackendError` within the backend's timeout.
    """

    timeout: float = DEFAULT_TIMEOUT_S

    def get_chat_template(self) -> ChatTemplate:
        """The model's chat template (used to render roles)."""
        raise NotImplementedError

    def generate(self, prompt: Prompt, params: SamplingParams) -> tuple[str, dict[str, Any]]:
        """Continue `prompt.text`; return (generated text, meta_info), or with `params.n`
        > 1 a list of n texts and a list of n meta_infos."""
        raise NotImplementedError

    def generate_stream(self, prompt: Prompt,
                        params: SamplingParams) -> Iterator[tuple[str, dict[str, Any]]]:
        """Like `generate`, yielding (new text piece, meta_info so far) as it is produced."""
        text, meta = self.generate(prompt, params)
        yield text, meta

    def score_choices(self, prompt: Prompt, choices: list[str],
                      need_unconditional: bool) -> ChoiceScores:
        """Logprobs of each choice's tokens after `prompt.text`, in one batched request."""
        raise NotImplementedError

    def select(self, prompt: Prompt, choices: list[str], temperature: float,
               method: ChoicesSamplingMethod) -> ChoicesDecision:
        """Pick one of `choices` as the continuation of `prompt.text`."""
        scores = self.score_choices(prompt, choices, method.requires_unconditional_logprobs)
        decision = method(choices, scores.input_token_logprobs,
                          scores.unconditional_token_logprobs, temperature)
        decision.meta_info.update(scores.meta_info)
        return decision

    def cache_prefix(self, prefix: str) -> None:
        """Prefill `prefix` into the server's prefix cache (no tokens generated)."""

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        """Release what the backend owns (an in-process engine, HTTP sessions)."""


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def split_choice_logprobs(prompt: str, full: str, entries: list) -> list:
    """Keep the logprob entries of tokens that cover any character after `prompt`.

    `entries` are `(logprob, token_id, text)` for the last tokens of `full` (= prompt + choice),
    with token texts filled in. When their texts do not concatenate to a suffix of `full`
    (a tokenizer that does not decode token by token), fall back to "all but the first".
    """
    texts = [e[2] or "" for e in entries]
    joined = "".join(texts)
    if not full.endswith(joined):
        return list(entries[1:]) if len(entries) > 1 else list(entries)
    pos = len(full) - len(joined)
    kept = []
    for entry, text in zip(entries, texts, strict=True):
        end = pos + len(text)
        if end > len(prompt):
            kept.append(entry)
        pos = end
    return kept


def call_with_timeout(fn: Callable[[], Any], timeout: float, what: str,
                      on_timeout: Callable[[], None] | None = None) -> Any:
    """Run a blocking call in a helper thread; BackendError if it takes longer than `timeout`."""
    return next(iter_with_timeout(lambda: iter([fn()]), timeout, what, on_timeout))


def iter_with_timeout(make_iter: Callable[[], Iterator[Any]], timeout: float, what: str,
                      on_timeout: Callable[[], None] | None = None) -> Iterator[Any]:
    """Iterate a blocking iterator in a helper thread with `timeout` seconds per item."""
    q: queue.Queue = queue.Queue()
    done = object()

    def pump() -> None:
        try:
            for item in make_iter():
                q.put((True, item))
            q.put((True, done))
        except BaseException as e:  # delivered to the consumer
            q.put((False, e))

    threading.Thread(target=pump, daemon=True, name="radixlm-backend-call").start()
    while True:
        try:
            ok, item = q.get(timeout=timeout)
        except queue.Empty:
            if on_timeout is not None:
                on_timeout()
            raise BackendError(f"{what} timed out after {timeout:g} s") from None
        if not ok:
            raise item
        if item is done:
            return
        yield item
