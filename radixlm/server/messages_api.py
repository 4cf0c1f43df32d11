"""Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

A wire-format translation over the intake (`intake.py`): the body becomes the Chat
Completions request it means (`messages_request.py`), so tool calling, reasoning,
constraints, sampling, admission and aborts are the chat route's. The answer comes back as
an Anthropic message: `thinking` blocks (from the reasoning parser, `signature` ""), `text`
and `tool_use` blocks (ids `toolu_...`, `input` an object), `stop_reason` end_turn /
max_tokens / stop_sequence (with `stop_sequence`) / tool_use, or
model_context_window_exceeded when `max_tokens` was clamped to the room left in the
context; `usage.input_tokens` counts the whole prompt. Streamed as Anthropic's named events
(message_start, ping, content_block_start / _delta / _stop, message_delta, message_stop; an
`error` event once the stream has started). Errors are in Anthropic's shape, 401 included
(the API key is also taken from `x-api-key`, as Anthropic clients send it).

Differences from api.anthropic.com: one model is served (any `model` name is accepted and
the served one is named in the answer); thinking needs a model with a reasoning parser;
`thinking.budget_tokens` may be below 1024; tools are client (custom) tools only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from radixlm.server.errors import AnthropicError, ApiError
from radixlm.server.generation import abandon, open_streams, run_calls
from radixlm.server.intake import (
    ChatIntake,
    admit_chat,
    chat_deltas,
    chat_input_ids,
    chat_output,
    tool_setup,
)
from radixlm.server.messages_request import (
    CountTokensRequest,
    MessagesRequest,
    chat_request,
    remap_error,
    validation_message,
)
from radixlm.server.reasoning import reasoning_parser_name
from radixlm.server.state import ServerState, get_state, logger
from radixlm.server.streaming import SSEResponse

PATH = "/v1/messages"  # this path and those under it answer errors in Anthropic's shape


class AnthropicRoute(APIRoute):
    """A route whose errors (body validation included) are answered in Anthropic's shape;
    the app's ApiError handler sends them."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def anthropic_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise AnthropicError(400, validation_message(exc.errors())) from None
            except ApiError as exc:
                raise AnthropicError.of(exc) from None
            except UnicodeError as exc:  # text that cannot be encoded: the client's input
                raise AnthropicError(400, "the request contains text that is not valid "
                                     f"Unicode: {exc}") from None

        return anthropic_handler


router = APIRouter(prefix="/v1", route_class=AnthropicRoute)


class ContentBlocks:
    """An answer's content blocks as they grow, and the stream events that grow them
    (`drain`). Thinking, text and a call each go into the open block of their kind, else a
    new one (the one before is stopped); the non-streamed route feeds the whole output at
    once, so both answer the same blocks. ``omit_thinking``: thinking blocks stay empty
    (`thinking.display: "omitted"`)."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.content: list[dict[str, Any]] = []
        self.omit_thinking = omit_thinking
        self._events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._json = ""  # the open tool_use block's input so far (JSON text)

    def drain(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def _start(self, block: dict[str, Any]) -> None:
        self.stop()
        self.content.append(block)
        self._open = block
        self._events.append({"type": "content_block_start", "index": len(self.content) - 1,
                             "content_block": dict(block)})

    def _delta(self, **delta: Any) -> None:
        self._events.append({"type": "content_block_delta", "index": len(self.content) - 1,
                             "delta": delta})

    def _writing(self, kind: str) -> dict[str, Any] | None:
        return self._open if self._open is not None and self._open["type"] == kind else None

    def thinking(self, text: str) -> None:
        if not text:
            return
        block = self._writing("thinking")
        if block is None:
            self._start(block := {"type": "thinking", "thinking": "", "signature": ""})
        if not self.omit_thinking:
            block["thinking"] += text
            self._delta(type="thinking_delta", thinking=text)

    def text(self, text: str) -> None:
        if not text:
            return
        block = self._writing("text")
        if block is None:
            self._start(block := {"type": "text", "text": ""})
        block["text"] += text
        self._delta(type="text_delta", text=text)

    def call(self, delta: dict[str, Any]) -> None:
        """One OpenAI tool-call delta (`ToolCallStream`): a first one with the call's id and
        name opens its block, argument fragments extend its input."""
        fn = delta.get("function") or {}
        if delta.get("id"):
            self._start({"type": "tool_use", "id": "toolu_" + delta["id"].removeprefix("call_"),
                         "name": fn.get("name", ""), "input": {}})
        if self._writing("tool_use") is not None and fn.get("arguments"):
            self._json += fn["arguments"]
            self._delta(type="input_json_delta", partial_json=fn["arguments"])

    def stop(self) -> None:
        """Stop the open block (a tool_use block's input is then its JSON text read; a call
        cut short by max_tokens keeps the input {}, its fragments are what was streamed)."""
        block, self._open = self._open, None
        if block is None:
            return
        if block["type"] == "tool_use":
            try:
                block["input"] = json.loads(self._json or "{}")
            except ValueError:
                pass
            self._json = ""
        self._events.append({"type": "content_block_stop", "index": len(self.content) - 1})


class _Turn:
    """One request's message: its head, and how an engine result ends it."""

    def __init__(self, body: MessagesRequest, intake: ChatIntake, state: ServerState) -> None:
        self.body, self.intake, self.state = body, intake, state
        self.call = intake.calls[0]
        self.id = f"msg_{self.call.rid}"
        self.omit_thinking = body.thinking is not None and body.thinking.display == "omitted"

    def message(self, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                output_tokens: int) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant",
                "model": self.state.model_id, "content": content, "stop_reason": stop[0],
                "stop_sequence": stop[1],
                "usage": {"input_tokens": self.call.prompt_len, "output_tokens": output_tokens}}

    def stop(self, finish: str | None, meta: dict[str, Any]) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of the chat finish reason and the result's meta."""
        if finish == "tool_calls":
            return "tool_use", None
        if finish == "length":
            params = self.call.params
            clamped = params is not None and params.max_new_tokens < self.body.max_tokens
            return ("model_context_window_exceeded" if clamped else "max_tokens"), None
        if finish == "stop":
            reason = meta.get("finish_reason")
            matched = reason.get("matched") if isinstance(reason, dict) else None
            if isinstance(matched, str) and matched in (self.body.stop_sequences or ()):
                return "stop_sequence", matched
            return "end_turn", None
        raise AnthropicError(503, "the request was aborted by the server before it finished",
                             code="aborted")


@router.post("/messages")
async def create_message(body: MessagesRequest, request: Request) -> Response:
    """Create a message (streamed as events with `stream: true`)."""
    state = get_state(request)
    chat, origins = chat_request(body, reasoning_parser_name(state))
    try:
        intake = await admit_chat(state, chat, request.state.request_id)
        turn, calls = _Turn(body, intake, state), intake.calls
        if body.stream:
            streams = await open_streams(state, calls)
            return SSEResponse(_events(turn, streams), on_close=lambda: abandon(state, calls),
                               stall_timeout=state.settings.stream_stall_timeout, named=True)
        results = await run_calls(state, calls, request)
    except ApiError as exc:  # the chat rules' and the engine's refusals
        raise remap_error(exc, origins) from None
    out = chat_output(intake, state, 0, results[0])
    blocks = ContentBlocks(turn.omit_thinking)
    blocks.thinking(out.reasoning or "")
    blocks.text(out.content or "")
    for i, call in enumerate(out.tool_calls):
        blocks.call({"index": i, "id": call["id"], "function": call["function"]})
    blocks.stop()
    meta = results[0]["meta_info"]
    return JSONResponse(turn.message(blocks.content, turn.stop(out.finish, meta),
                                     int(meta.get("completion_tokens", 0))))


async def _events(turn: _Turn, streams: list[Any]) -> AsyncIterator[dict[str, Any]]:
    """The message's stream events; an error once the stream has started is an `error`
    event (and the stream ends)."""
    yield {"type": "message_start", "message": turn.message([], (None, None), 0)}
    yield {"type": "ping"}
    blocks = ContentBlocks(turn.omit_thinking)
    finish, final = None, None
    try:
        async for d in chat_deltas(turn.state, turn.intake, streams):
            blocks.thinking(d.reasoning)
            blocks.text(d.content)
            for call in d.tool_calls:
                blocks.call(call)
            if d.finish is not None:
                finish, final = d.finish, d.chunk
            for event in blocks.drain():
                yield event
        blocks.stop()
        meta = final["meta_info"] if final is not None else {}
        stop = turn.stop(finish, meta)
    except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
        if not isinstance(exc, ApiError):
            logger.exception("stream failed")
            exc = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
        yield AnthropicError.of(exc).body()
        return
    for event in blocks.drain():
        yield event
    yield {"type": "message_delta", "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
           "usage": {"output_tokens": int(meta.get("completion_tokens", 0))}}
    yield {"type": "message_stop"}


@router.post("/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, Any]:
    """The number of tokens of the prompt the chat template makes of this conversation (and
    its tools), as `POST /v1/messages` would send it to the model."""
    state = get_state(request)
    chat, origins = chat_request(body, reasoning_parser_name(state))
    try:
        tools = tool_setup(state, chat)
        ids = await state.prep.run(lambda: chat_input_ids(state, chat, tools))
    except ApiError as exc:
        raise remap_error(exc, origins) from None
    return {"input_tokens": len(ids)}
