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
from typing import TYPE_CHECKING, Any

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod

if TYPE_CHECKING:  # annotations only: gen_args reads global_config, which imports backends
    from radixlm.formats.tool_parsers import ToolCallParser
    from radixlm.lang.gen_args import GenArgs

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


@dataclass
class ChoiceLogprobs:
    """What a backend read for one prompt+choice, before the choice's own tokens are picked
    out (see `Backend.score_choices`)."""

    entries: list  # (logprob, token_id, text) of the last tokens of prompt+choice, in order
    # The choice's own token ids, where the backend tokenized prompt and prompt+choice
    # itself (they are the last of `entries`); None: found from the token texts.
    choice_ids: list[int] | None = None
    meta_info: dict[str, Any] | None = None  # the server's meta_info of the request


class Backend:
    """Base class of frontend backends.

    Subclasses implement `generate`, `generate_stream`, `cache_prefix`, `get_chat_template`
    and, for `select`, `choice_logprobs` (with `unconditional_logprobs` where the server can
    score tokens without context); the rest have working defaults. Every call either returns
    or raises `BackendError` within the backend's timeout.
    """

    timeout: float = DEFAULT_TIMEOUT_S

    def get_chat_template(self) -> ChatTemplate:
        """The model's chat template (used to render roles)."""
        raise NotImplementedError

    def generate(self, prompt: Prompt, params: GenArgs) -> tuple[str, dict[str, Any]]:
        """Continue `prompt.text`; return (generated text, meta_info), or with `params.n`
        > 1 a list of n texts and a list of n meta_infos."""
        raise NotImplementedError

    def generate_stream(self, prompt: Prompt,
                        params: GenArgs) -> Iterator[tuple[str, dict[str, Any]]]:
        """Like `generate`, yielding (new text piece, meta_info so far) as it is produced."""
        text, meta = self.generate(prompt, params)
        yield text, meta

    def choice_logprobs(self, prompt: str, choices: list[str]) -> list[ChoiceLogprobs]:
        """Logprobs of the last tokens of each `prompt + choice` (at least the choice's own),
        read in one batched request."""
        raise NotImplementedError

    def unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list] | None:
        """Logprob entries of each token list scored on its own (no prompt before it); None
        where the server cannot."""
        return None

    def score_choices(self, prompt: Prompt, choices: list[str],
                      need_unconditional: bool) -> ChoiceScores:
        """Logprobs of each choice's tokens after `prompt.text`, in one batched request.

        Read the last tokens of every prompt+choice (`choice_logprobs`), keep the choice's own
        (by token ids where the backend knows them, else by the token texts), and for methods
        that need it score those tokens again without the prompt (`unconditional_logprobs`).
        """
        read = self.choice_logprobs(prompt.text, choices)
        scored = [[tuple(e) for e in _own_tokens(prompt.text, c, r)]
                  for c, r in zip(choices, read, strict=True)]
        uncond = None
        if need_unconditional:
            entries = self.unconditional_logprobs([[e[1] for e in s] for s in scored])
            if entries is not None:
                uncond = [[tuple(e) for e in u] for u in entries]
        metas = [r.meta_info for r in read if r.meta_info is not None]
        meta = {"prompt_tokens": [m["prompt_tokens"] for m in metas],
                "cached_tokens": [m.get("cached_tokens", 0) for m in metas]} if metas else {}
        return ChoiceScores(scored, uncond, meta)

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

    def tool_parser(self) -> ToolCallParser:
        """The tool-call format of the served model, for `gen(tools=...)`."""
        raise BackendError(f"gen(tools=...) is not supported by {type(self).__name__}; use "
                           "Runtime or RuntimeEndpoint")

    def token_ids(self, text: str) -> list[int]:
        """`text`'s token ids in the served model's tokenizer (no special tokens added)."""
        raise BackendError(f"{type(self).__name__} cannot tokenize")

    def check_grammar(self, grammar: str) -> None:
        """ValueError if the Lark `grammar` does not compile; by default the server checks
        it when the request arrives."""

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


def _own_tokens(prompt: str, choice: str, read: ChoiceLogprobs) -> list:
    """The entries of `read` that are `choice`'s own tokens."""
    if read.choice_ids is None:
        return split_choice_logprobs(prompt, prompt + choice, read.entries)
    tail = read.entries[len(read.entries) - len(read.choice_ids):]
    if [e[1] for e in tail] != read.choice_ids:
        raise BackendError("engine input logprobs do not line up with the choice's tokens: "
                           f"{[e[1] for e in tail]} vs {read.choice_ids}")
    return tail


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
