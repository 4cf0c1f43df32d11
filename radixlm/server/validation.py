"""One validation of generation requests for every route, run off the event loop.

- `SamplingParamsBody`: the pydantic model of `sampling_params` on /generate, built from the
  bounds in `runtime/sampling_params.py` (the OpenAI models in `protocol.py` use the same
  numbers), so /openapi.json states what the server enforces.
- `prepare_calls(state, calls)`: for each call, refuses text that is not valid UTF-8 (lone
  surrogates) or longer in bytes than any prompt that fits the context, tokenizes it, and
  validates its sampling parameters and logprob options exactly as the engine will
  (`SamplingParams.from_dict`), so bad input is a 400 before admission. It runs in a
  bounded thread pool (`PrepPool`): a 5 MB prompt never stalls /health, and a flood of
  them is refused (429) instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from radixlm.runtime.sampling_params import (
    MAX_N,
    MAX_STOP,
    MAX_STOP_LEN,
    PENALTY_RANGE,
    REPETITION_PENALTY_RANGE,
    TEMPERATURE_RANGE,
    SamplingParams,
    check_top_logprobs_num,
)
from radixlm.server.errors import ApiError

T = TypeVar("T")

StopString = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_LEN)]
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP)]
Prob = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


def bounded(lo_hi: tuple[float, float], **kw: Any) -> Any:
    """A pydantic Field for a finite float in the closed range `lo_hi`."""
    return Field(default=None, ge=lo_hi[0], le=lo_hi[1], allow_inf_nan=False, **kw)


class SamplingParamsBody(BaseModel):
    """`sampling_params` of /generate (SGLang's SamplingParams; None means the default)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(default=None, ge=0)
    min_new_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = bounded(TEMPERATURE_RANGE)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: Prob | None = None
    frequency_penalty: float | None = bounded(PENALTY_RANGE)
    presence_penalty: float | None = bounded(PENALTY_RANGE)
    repetition_penalty: float | None = bounded(REPETITION_PENALTY_RANGE)
    stop: StopString | StopList | None = None
    stop_token_ids: int | list[int] | None = None
    stop_regex: str | StopList | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    seed: int | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    choices: list[str] | None = Field(default=None, min_length=1)
    dtype: str | None = None
    whitespace_pattern: str | None = None
    sampling_seed: int | None = None  # SGLang's spelling of seed
    logit_bias: dict[str, float] | None = None
    stream_interval: int | None = Field(default=None, ge=1)
    # SGLang keys this engine cannot serve: accepted here so the engine refuses them by name
    ebnf: Any = None
    structural_tag: Any = None
    custom_params: Any = None


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
    and sentencepiece spellings are never shorter than the bytes they stand for)."""
    longest = 64  # unknown tokenizers: generous
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        try:
            tokens = convert(list(range(len(tokenizer))))
            longest = max(len(str(t).encode("utf-8", "replace")) for t in tokens if t)
        except Exception:  # noqa: BLE001 - keep the generous default
            pass
    return context_len * max(longest, 4)


def validate_call_params(sampling: dict[str, Any], top_logprobs_num: int) -> None:
    """The engine's own checks on one call's parameters; ApiError 400 naming the problem."""
    try:
        SamplingParams.from_dict(dict(sampling))
        check_top_logprobs_num(top_logprobs_num)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, str(exc), param="sampling_params") from exc


def prepare_sync(calls: Sequence[Any], tokenizer: Any, max_bytes: int) -> None:
    """Check and tokenize the text of `calls` in place (each distinct text once), and
    validate their parameters. Runs on a pool worker."""
    ids_of: dict[int, list[int]] = {}
    for call in calls:
        validate_call_params(call.sampling, call.top_logprobs_num)
        stops = call.sampling.get("stop") or ()
        for s in [stops] if isinstance(stops, str) else stops:
            check_text(s, "stop")
        if call.text is None:
            continue
        key = id(call.text)
        if key not in ids_of:
            check_text(call.text, "prompt", max_bytes)
            # the engine tokenizes prompts the same way (no special tokens added)
            ids_of[key] = list(tokenizer.encode(call.text, add_special_tokens=False))
        call.input_ids = ids_of[key]
