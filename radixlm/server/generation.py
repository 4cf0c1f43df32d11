"""The one place where HTTP routes call the engine.

Every route turns its body into `GenCall`s (one per prompt and sample: the server fans out
batches and `n` itself so each engine request has a rid it can abort), then:

- `admit(state, calls)` validates them (once, into the `SamplingParams` the engine takes)
  and tokenizes them off the event loop (`validation.prepare_sync`), checks prompt length
  against the context (400 when the prompt alone does not fit; `max_new_tokens` is clamped
  to what is left otherwise) and takes one place per call in the engine's waiting queue,
  all or none (429 with Retry-After when full);
- `run_calls(...)` awaits the results (generations, or embeddings for `encode` calls),
  aborting every unfinished rid when the client disconnects, the request times out (504)
  or the handler is cancelled (shutdown);
- `open_streams(...)` submits streamed calls before any byte is sent (so a refusal is still
  an HTTP error), and `merge_streams(...)` yields their cumulative result chunks, with the
  same abort guarantees.

A call the engine ends because of its input is a 400; one it ends because of an internal
failure is a 500 (an in-band error event once a stream has started), never a 200.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from radixlm.runtime.request_rules import PromptFillsContext, fit_max_new_tokens
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.server.errors import ApiError
from radixlm.server.state import ServerState, logger
from radixlm.server.validation import prepare_sync


class ClientDisconnected(Exception):
    """The client went away before the result was ready (its requests were aborted)."""


@dataclass
class GenCall:
    """One engine request: a prompt (text or token ids), sampling params, logprob options.
    `sampling` holds the parameters as the body gave them; `admit` validates them once into
    `params`, the object the engine takes."""

    text: str | None
    input_ids: list[int] | None
    sampling: dict[str, Any]
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    priority: int | None = None  # scheduling priority (the engine's priority policy)
    log_metrics: bool = True  # False: not counted in /metrics nor logged (health checks)
    # an embedding (engine.async_encode: a prompt that produces no token), its result cut to
    # `dimensions` (None: all) and renormalised
    encode: bool = False
    dimensions: int | None = None
    prompt_len: int = 0  # filled by admit()
    admission: Any = None  # the engine's reservation this call takes its place from
    params: SamplingParams | None = None  # `sampling` validated, filled by admit()

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for engine.generate / async_generate (token ids once admit()
        has tokenized the text, so the engine does not tokenize on the event loop); for an
        `encode` call those of engine.async_encode."""
        kw: dict[str, Any] = {"rid": self.rid}
        if self.input_ids is not None:
            kw["input_ids"] = self.input_ids
        else:
            kw["prompt"] = self.text
        if self.admission is not None:
            kw["admission"] = self.admission
        if self.encode:
            return {**kw, "dimensions": self.dimensions}
        kw["sampling_params"] = self.params if self.params is not None else dict(self.sampling)
        if self.return_logprob:
            kw.update(return_logprob=True, logprob_start_len=self.logprob_start_len,
                      top_logprobs_num=self.top_logprobs_num)
        if self.return_text_in_logprobs:
            kw["return_text_in_logprobs"] = True
        if self.priority is not None:
            kw["priority"] = self.priority
        return kw


def clean_sampling(params: dict[str, Any] | None) -> dict[str, Any]:
    """Drop None values (None means the engine's default)."""
    return {k: v for k, v in (params or {}).items() if v is not None}


async def admit(state: ServerState, calls: Sequence[GenCall]) -> None:
    """Validate, tokenize (off the loop), check the context, and reserve one queue place per
    call, all or none; raise ApiError (400/429/503). The caller releases the reservation
    (`release(calls)`) once the calls are submitted or given up."""
    if state.shutting_down:
        raise ApiError(503, "server is shutting down", code="shutting_down")
    if not state.engine_alive:
        raise ApiError(503, "the engine has stopped; the server is going down",
                       code="engine_dead")
    for call in calls:
        if call.input_ids is not None and not call.input_ids:
            raise ApiError(400, "the prompt is empty", param="input_ids")
    tokenizer, max_bytes = state.engine.tokenizer, state.max_prompt_bytes
    await state.prep.run(lambda: prepare_sync(calls, tokenizer, max_bytes))
    ctx = state.context_len
    for call in calls:
        call.prompt_len = len(call.input_ids or ())
        if call.encode:  # an embedding adds no token
            if call.prompt_len > ctx:
                raise ApiError(400, f"the input has {call.prompt_len} tokens but the context "
                                    f"length is {ctx}", param="input",
                               code="context_length_exceeded")
            continue
        try:  # given or the default, max_new_tokens is clamped to the room, as SGLang does
            call.params.max_new_tokens = fit_max_new_tokens(
                call.prompt_len, call.params.max_new_tokens, ctx)
        except PromptFillsContext as exc:
            raise ApiError(400, f"the prompt has {call.prompt_len} tokens but the context length "
                                f"is {ctx} (prompt + at least one new token must fit)",
                           param="prompt", code="context_length_exceeded") from exc
    reserve = getattr(state.engine, "reserve", None)
    if reserve is None:
        return
    try:
        admission = reserve(len(calls), limit=state.settings.max_queued_requests)
    except Exception as exc:
        raise engine_error(state, exc) from exc
    for call in calls:
        call.admission = admission


def release(calls: Sequence[GenCall]) -> None:
    """Give back the queue places `calls` reserved and did not use."""
    for call in calls:
        if call.admission is not None:
            call.admission.release()


def engine_error(state: ServerState, exc: Exception) -> ApiError:
    """Map an engine exception to an ApiError."""
    if isinstance(exc, ApiError):
        return exc
    if type(exc).__name__ == "QueueFullError":  # the engine's own admission error
        return ApiError(429, f"{exc}; retry later", code="queue_full",
                        headers={"Retry-After": str(state.settings.retry_after_s)})
    if isinstance(exc, (ValueError, TypeError)):
        return ApiError(400, str(exc))
    if type(exc).__name__ == "EngineDeadError":
        return ApiError(503, str(exc), code="engine_dead")
    logger.error("engine error", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def _request_error(meta: dict[str, Any]) -> ApiError | None:
    """A request the engine aborted because of its own input (e.g. a constraint that failed
    to compile: finish_reason {"type": "abort", "error": "invalid_constraint"} or one with a
    4xx "status_code", as SGLang sends) is answered as a 400, one it aborted because of an
    internal failure ("status_code" 5xx) as that error, never as a result."""
    reason = meta.get("finish_reason")
    if not isinstance(reason, dict) or reason.get("type") != "abort":
        return None
    status = reason.get("status_code")
    if reason.get("error") == "invalid_constraint" or (isinstance(status, int)
                                                       and 400 <= status < 600):
        return ApiError(status if isinstance(status, int) else 400,
                        str(reason.get("message", "invalid request")),
                        code=reason.get("error"))
    return None


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_calls(state: ServerState, calls: Sequence[GenCall],
                    request: Request) -> list[dict[str, Any]]:
    """Run `calls` to completion; results in order. Unfinished rids are aborted on error,
    disconnect (ClientDisconnected), timeout (ApiError 504) or cancellation."""
    engine = state.engine
    t0 = time.perf_counter()
    pending = {c.rid for c in calls}
    state.inflight.update(pending)

    async def one(call: GenCall) -> dict[str, Any]:
        run = engine.async_encode if call.encode else engine.async_generate
        out = await run(**call.engine_kwargs())
        pending.discard(call.rid)
        if call.log_metrics:
            state.metrics.observe_finished(call.rid, out.get("meta_info", {}),
                                           time.perf_counter() - t0, streamed=False)
        return out

    gen = asyncio.ensure_future(asyncio.gather(*(one(c) for c in calls)))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({gen, watch}, timeout=state.settings.request_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if gen in done:
            try:
                results = gen.result()
            except Exception as exc:
                raise engine_error(state, exc) from exc
            for out in results:
                error = _request_error(out.get("meta_info", {}))
                if error is not None:
                    raise error
            return results
        if watch in done:
            raise ClientDisconnected()
        raise ApiError(504, f"request timed out after {state.settings.request_timeout} s; "
                            "it was aborted", code="timeout")
    finally:
        for task in (gen, watch):
            task.cancel()
            task.add_done_callback(_retrieve)
        for rid in pending:
            state.abort(rid)
        state.inflight.difference_update(c.rid for c in calls)
        release(calls)


def _retrieve(task: asyncio.Future) -> None:
    """Mark a cancelled helper's outcome as seen (no "exception never retrieved" noise)."""
    if not task.cancelled():
        task.exception()


async def _open_stream(engine: Any, call: GenCall) -> AsyncIterator[dict[str, Any]]:
    """engine.async_generate(stream=True) as an async iterator (awaitable or async gen)."""
    result = engine.async_generate(stream=True, **call.engine_kwargs())
    if inspect.isawaitable(result) and not hasattr(result, "__anext__"):
        result = await result
    return result  # type: ignore[return-value]


async def open_streams(state: ServerState, calls: Sequence[GenCall]) -> list[Any]:
    """Submit every call as a stream now (after `admit`), so that a refusal is an HTTP
    error before the response starts; on failure the ones opened are aborted."""
    opened: list[Any] = []
    try:
        for call in calls:
            opened.append(await _open_stream(state.engine, call))
            state.inflight.add(call.rid)
    except Exception as exc:
        for call, it in zip(calls, opened, strict=False):
            state.abort(call.rid)
            state.inflight.discard(call.rid)
            await _close(it, call.rid)
        raise engine_error(state, exc) from exc
    finally:
        release(calls)
    return opened


def abandon(state: ServerState, calls: Sequence[GenCall]) -> None:
    """Abort the calls of a stream whose response ended before their streams did (e.g. the
    client left before the first byte, so the event generator never ran)."""
    for call in calls:
        if call.rid in state.inflight:
            state.abort(call.rid)
            state.inflight.discard(call.rid)


async def _close(it: Any, rid: str) -> None:
    if hasattr(it, "aclose"):
        try:
            await it.aclose()
        except Exception:  # noqa: BLE001 - the engine stream is done with either way
            logger.debug("closing the engine stream of %s failed", rid, exc_info=True)


async def stream_call(state: ServerState, call: GenCall,
                      it: Any) -> AsyncIterator[dict[str, Any]]:
    """Yield the engine's cumulative chunks for `call` from its opened stream `it`; abort
    it unless it finished."""
    timeout = state.settings.request_timeout
    t0 = time.perf_counter()
    deadline = None if timeout is None else t0 + timeout
    finished = False
    last_t, last_n = None, 0
    state.inflight.add(call.rid)
    try:
        while True:
            left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
            try:
                chunk = await asyncio.wait_for(it.__anext__(), left)
            except StopAsyncIteration:
                break
            except TimeoutError as exc:
                raise ApiError(504, f"request timed out after {timeout} s; it was aborted",
                               code="timeout") from exc
            except Exception as exc:
                raise engine_error(state, exc) from exc
            now = time.perf_counter()
            n = len(chunk.get("output_ids") or ())
            if call.log_metrics and n > last_n:
                if last_t is None:
                    state.metrics.ttft.observe(now - t0)
                else:
                    state.metrics.itl.observe((now - last_t) / (n - last_n))
                last_t, last_n = now, n
            reason = chunk.get("meta_info", {}).get("finish_reason")
            if reason is not None:
                finished = True
                error = _request_error(chunk["meta_info"])
                if error is not None:
                    raise error
                if call.log_metrics:
                    state.metrics.observe_finished(call.rid, chunk["meta_info"], now - t0,
                                                   streamed=True)
            yield chunk
            if finished:
                break
    except ApiError as exc:
        state.metrics.count_error(exc)
        raise
    finally:
        if not finished:
            state.abort(call.rid)
        state.inflight.discard(call.rid)
        await _close(it, call.rid)


async def merge_streams(state: ServerState, calls: Sequence[GenCall],
                        streams: Sequence[Any]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """Interleave the opened `streams` of `calls` as (index, chunk); errors propagate and
    every unfinished call is aborted when the consumer stops early."""
    if len(calls) == 1:
        async for chunk in stream_call(state, calls[0], streams[0]):
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, dict[str, Any] | None, Exception | None]] = asyncio.Queue()

    async def pump(i: int, call: GenCall) -> None:
        try:
            async for chunk in stream_call(state, call, streams[i]):
                await queue.put((i, chunk, None))
            await queue.put((i, None, None))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, exc))

    tasks = [asyncio.ensure_future(pump(i, c)) for i, c in enumerate(calls)]
    try:
        open_streams = len(tasks)
        while open_streams:
            i, chunk, exc = await queue.get()
            if exc is not None:
                raise exc
            if chunk is None:
                open_streams -= 1
            else:
                yield i, chunk
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
