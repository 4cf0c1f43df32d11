"""Ollama's answers (`/api/chat`, `/api/generate`): a request's engine output as Ollama's
chunks (`Reply`: `message` or `response` pieces, tool calls whole with arguments as
objects, the final chunk's done reason, counts and durations in nanoseconds), sent as one
object (`stream: false`) or as NDJSON lines (`NDJSONResponse`) once the first chunk has come
(`answer`), and the answer to a body with nothing to generate (`loaded`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.server.errors import ApiError, OllamaError
from radixlm.server.generation import ClientDisconnected, abandon, open_streams, run_calls
from radixlm.server.intake import ChatDelta, ChatIntake, chat_deltas, chat_output
from radixlm.server.ollama_messages import ollama_call
from radixlm.server.ollama_models import iso_time
from radixlm.server.ollama_request import ollama_name, remap_error
from radixlm.server.openai_api import chat_logprobs
from radixlm.server.state import ServerState, logger
from radixlm.server.streaming import SSEResponse

_DONE = {"stop": "stop", "tool_calls": "stop", "length": "length"}


class NDJSONResponse(SSEResponse):
    """A stream of JSON lines (Ollama's), with the SSE response's guarantees (its `__call__`,
    over the attributes set here): the source is closed when the client leaves (its requests
    aborted), a client that stops reading is dropped after the stall timeout."""

    media_type = "application/x-ndjson"

    def __init__(self, lines: AsyncIterator[dict[str, Any]], on_close: Callable[[], None],
                 stall_timeout: float) -> None:
        self._events, self._on_close, self._stall_timeout = lines, on_close, stall_timeout
        StreamingResponse.__init__(self, _encode(lines), headers={
            "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _encode(lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for line in lines:
            yield (json.dumps(line, ensure_ascii=False) + "\n").encode()
    finally:
        await lines.aclose()  # type: ignore[attr-defined]


class Reply:
    """One request's answer: its chunks' head, each delta as a chunk, the final chunk."""

    def __init__(self, state: ServerState, intake: ChatIntake, chat: bool, logprobs: bool,
                 t0: float) -> None:
        self.state, self.intake, self.chat, self.logprobs, self.t0 = \
            state, intake, chat, logprobs, t0
        self.sent_lp = 0
        self._open: dict[str, Any] | None = None  # the streamed call being written
        self._calls = 0

    def head(self) -> dict[str, Any]:
        return {"model": ollama_name(self.state), "created_at": iso_time()}

    def piece(self, content: str, thinking: str | None,
              calls: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.chat:
            return {"response": content, **({"thinking": thinking} if thinking else {})}
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}

    def lp(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The logprobs of the tokens not sent yet (nothing unless asked)."""
        if not self.logprobs:
            return {}
        content = chat_logprobs(meta, self.sent_lp)["content"]
        self.sent_lp += len(content)
        return {"logprobs": content}

    def final(self, finish: str | None, meta: dict[str, Any]) -> dict[str, Any]:
        if finish not in _DONE:
            raise OllamaError(503, "the request was aborted by the server before it "
                              "finished", code="aborted")
        total = time.perf_counter() - self.t0
        e2e = float(meta.get("e2e_latency", total) or 0.0)
        ttft = float(meta.get("ttft", 0.0) or 0.0)

        def ns(seconds: float) -> int:
            return max(int(seconds * 1e9), 0)

        return {"done": True, "done_reason": _DONE[finish], "total_duration": ns(total),
                "load_duration": ns(total - e2e),
                "prompt_eval_count": int(meta.get("prompt_tokens", 0)),
                "prompt_eval_duration": ns(ttft),
                "eval_count": int(meta.get("completion_tokens", 0)),
                "eval_duration": ns(e2e - ttft)}

    def calls(self, deltas: list[dict[str, Any]], final: bool) -> list[dict[str, Any]]:
        """Streamed OpenAI call deltas in, the calls they complete out (Ollama's, whole)."""
        done = []
        for d in deltas:
            fn = d.get("function") or {}
            if d.get("id"):
                done += self._close()
                self._open = {"id": d["id"], "function": {"name": fn.get("name", ""),
                                                          "arguments": ""}}
            if self._open is not None and fn.get("arguments"):
                self._open["function"]["arguments"] += fn["arguments"]
        return done + (self._close() if final else [])

    def _close(self) -> list[dict[str, Any]]:
        call, self._open = self._open, None
        if call is None:
            return []
        self._calls += 1
        return [ollama_call(call, self._calls - 1)]

    def whole(self, result: dict[str, Any]) -> dict[str, Any]:
        """The answer of a finished result (`stream: false`)."""
        out = chat_output(self.intake, self.state, 0, result)
        calls = [ollama_call(c, i) for i, c in enumerate(out.tool_calls)]
        meta = result["meta_info"]
        return {**self.head(), **self.piece(out.content or "", out.reasoning, calls),
                **self.lp(meta), **self.final(out.finish, meta)}

    async def lines(self, first: ChatDelta | None,
                    deltas: AsyncIterator[ChatDelta]) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks from its first delta on; an error is a last `error` line."""
        try:
            d = first
            while d is not None:
                calls = self.calls(d.tool_calls, d.finish is not None)
                lp = self.lp(d.chunk["meta_info"])
                if d.content or d.reasoning or calls or lp:
                    yield {**self.head(), **self.piece(d.content, d.reasoning, calls), **lp,
                           "done": False}
                if d.finish is not None:
                    yield {**self.head(), **self.piece("", None, []),
                           **self.final(d.finish, d.chunk["meta_info"])}
                    return
                d = await anext(deltas, None)
        except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
            if not isinstance(exc, ApiError):
                logger.exception("stream failed")
                exc = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
            yield remap_error(exc).body()
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]


async def _first(deltas: AsyncIterator[ChatDelta], request: Request) -> ChatDelta | None:
    """The stream's first delta, before the response starts (an error is still an HTTP
    error); ClientDisconnected (the calls aborted) when the client leaves meanwhile."""
    nxt = asyncio.ensure_future(anext(deltas, None))

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({nxt, watch}, return_when=asyncio.FIRST_COMPLETED)
        if nxt.done():
            return nxt.result()
        raise ClientDisconnected()
    finally:
        for task in (nxt, watch):
            task.cancel()
        await asyncio.gather(nxt, watch, return_exceptions=True)


async def answer(state: ServerState, reply: Reply, request: Request, stream: bool) -> Response:
    """Run the admitted calls of ``reply``: one object, or an NDJSON stream once its first
    delta has come (the calls are aborted when the client leaves, either way)."""
    calls = reply.intake.calls
    if not stream:
        results = await run_calls(state, calls, request)
        return JSONResponse(reply.whole(results[0]))
    streams = await open_streams(state, calls)
    deltas = chat_deltas(state, reply.intake, streams)
    try:
        first = await _first(deltas, request)
    except BaseException:
        await deltas.aclose()  # type: ignore[attr-defined]
        abandon(state, calls)
        raise
    return NDJSONResponse(reply.lines(first, deltas), on_close=lambda: abandon(state, calls),
                          stall_timeout=state.settings.stream_stall_timeout)


def loaded(state: ServerState, chat: bool) -> JSONResponse:
    """The answer to a body with nothing to generate: the model is loaded (it always is)."""
    piece = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse({"model": ollama_name(state), "created_at": iso_time(), **piece,
                         "done": True, "done_reason": "load"})
