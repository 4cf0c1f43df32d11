"""The rules of a request that every entry point applies, each written once here: the engine
(`Engine._prepare`), the HTTP server's admission (`server/generation.admit`) and its routes
(native `/generate`, the OpenAI-shaped intake every chat route goes through). Plain Python:
it imports neither torch nor anything of the package, so the server and the runtime both
take it without loading more.

- `fan_out_samples(rid, n, seed)`: the ``n`` samples of a request, sample j with seed
  ``seed + j`` (when a seed is given) and rid ``rid-j`` (``rid`` itself when it is the only
  one); `sample_rid` and `sample_seed` are the two halves.
- `fit_max_new_tokens(prompt_len, max_new_tokens, context_len)`: a prompt must leave room
  for one new token (`PromptFillsContext` otherwise), and ``max_new_tokens`` past the room
  left in the context is clamped to it (``strict``: a ValueError instead).

The bounds of single fields (``n``, ``top_logprobs_num``, ``logit_bias``, one constraint
per request) are `sampling_params.py`'s.
"""

from __future__ import annotations

from typing import Any


def sample_rid(base: str, index: int, count: int) -> str:
    """The rid of request ``index`` of the ``count`` one request with rid ``base`` is split
    into: ``base`` itself when it is the only one, else ``base-index``."""
    return base if count == 1 else f"{base}-{index}"


def sample_seed(seed: Any, j: int) -> Any:
    """Sample j's seed: ``seed + j`` (sample 0 keeps the seed as given; None stays None, a
    random seed per sample)."""
    if seed is None or j == 0:
        return seed
    return int(seed) + j


def fan_out_samples(rid: str, n: int, seed: Any, *, first: int = 0,
                    count: int | None = None) -> list[tuple[str, Any]]:
    """(rid, seed) of each of the ``n`` samples of a request: sample j gets seed + j and rid
    `sample_rid(rid, first + j, count)`. ``count`` (default ``n``): how many requests share
    the rid ``rid`` (all the samples of every prompt of an OpenAI body, numbered from
    ``first``)."""
    count = n if count is None else count
    return [(sample_rid(rid, first + j, count), sample_seed(seed, j)) for j in range(n)]


class PromptFillsContext(ValueError):
    """The prompt leaves no room for a new token in the context."""

    def __init__(self, prompt_len: int, context_len: int) -> None:
        super().__init__(f"prompt has {prompt_len} tokens; the context is {context_len}")
        self.prompt_len = prompt_len
        self.context_len = context_len


def fit_max_new_tokens(prompt_len: int, max_new_tokens: int, context_len: int, *,
                       strict: bool = False) -> int:
    """``max_new_tokens`` fitted to the room the prompt leaves in the context: the room when
    it asks for more (as SGLang clamps), or with ``strict`` a ValueError. A prompt of
    ``context_len`` tokens or more is `PromptFillsContext` (a ValueError)."""
    if prompt_len >= context_len:
        raise PromptFillsContext(prompt_len, context_len)
    room = context_len - prompt_len
    if max_new_tokens <= room:
        return max_new_tokens
    if strict:
        raise ValueError(f"max_new_tokens={max_new_tokens} goes beyond the context: prompt "
                         f"{prompt_len} + max_new_tokens > {context_len}")
    return room
