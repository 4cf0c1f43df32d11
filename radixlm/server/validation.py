"""One validation of generation requests for every route, run off the event loop.

`prepare_sync(calls, ...)` (run by `generation.admit` in a bounded thread pool, `PrepPool`):
for each call, refuses text that is not valid UTF-8 (lone surrogates) or longer in bytes
than any prompt that fits the context, tokenizes it, and validates its sampling parameters
and logprob options into the `SamplingParams` the engine then takes as it is (parsed once,
here), so bad input is a 400 before admission. A 5 MB prompt never stalls /health, and a
flood of them is refused (429) instead of queueing without bound. The request models of
`sampling_params` are in `sampling_body.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from radixlm.runtime.sampling_params import SamplingParams, check_top_logprobs_num
from radixlm.server.errors import ApiError

T = TypeVar("T")


class PrepPool:
    """A bounded thread pool for CPU work a request needs before admission (tokenizing,
    chat templates, validation). At most `max_pending` jobs wait or run; more are a 429."""

    def __init__(self, workers: int, max_pending: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixlm-prep")
        self.max_pending = max_pending
        self.pending = 0  # touched only on the event loop

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a worker; ApiError 429 when `max_pending` jobs are in the pool."""
        if self.pending >= self.max_pending:
            raise ApiError(429, f"the server is busy preparing {self.pending} requests; "
                                "retry later", code="busy", headers={"Retry-After": "1"})
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        finally:
            self.pending -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def check_text(text: str, param: str, max_bytes: int | None = None) -> None:
    """ApiError 400 unless `text` is encodable UTF-8 (no lone surrogates) and, when
    `max_bytes` is given, at most that many bytes long."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"'{param}' is not valid Unicode: {exc.reason} at position "
                            f"{exc.start} (a lone UTF-16 surrogate escape?)", param=param) from exc
    if max_bytes is not None and size > max_bytes:
        raise ApiError(400, f"'{param}' is {size} bytes; no prompt over {max_bytes} bytes fits "
                            "the context", param=param, code="context_length_exceeded")


def max_prompt_bytes(tokenizer: Any, context_len: int) -> int:
    """An upper bound on the UTF-8 size of any text that tokenizes to fewer than
    `context_len` tokens: context_len x the longest token's spelling in bytes (byte-level
    and sentencepiece spellings are never shorter than the bytes they stand for). The
    spellings are the vocabulary's keys (added tokens included): a GGUF's tokenizer answers
    them from its backend, where converting every id built transformers' tokenizer first
    (~0.6 s of the event loop at a server's first request)."""
    longest = 64  # unknown tokenizers: generous
    try:
        longest = max(len(str(t).encode("utf-8", "replace")) for t in tokenizer.get_vocab() if t)
    except Exception:  # noqa: BLE001 - keep the generous default
        pass
    return context_len * max(longest, 4)


def parse_call_params(sampling: dict[str, Any], top_logprobs_num: int) -> SamplingParams:
    """One call's parameters validated into the SamplingParams handed to the engine (the
    engine's own checks); ApiError 400 naming the problem."""
    try:
        params = SamplingParams.from_dict(dict(sampling))
        check_top_logprobs_num(top_logprobs_num)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, str(exc), param="sampling_params") from exc
    return params


def prepare_sync(calls: Sequence[Any], tokenizer: Any, max_bytes: int) -> None:
    """Check and tokenize the text of `calls` in place (each distinct text once), and
    validate their parameters into `call.params`. Runs on a pool worker."""
    ids_of: dict[int, list[int]] = {}
    for call in calls:
        call.params = parse_call_params(call.sampling, call.top_logprobs_num)
        for s in call.params.stop:
            check_text(s, "stop")
        if call.text is None:
            continue
        key = id(call.text)
        if key not in ids_of:
            check_text(call.text, "prompt", max_bytes)
            # the engine tokenizes prompts the same way (no special tokens added)
            ids_of[key] = list(tokenizer.encode(call.text, add_special_tokens=False))
        call.input_ids = ids_of[key]
