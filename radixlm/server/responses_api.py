"""OpenAI Responses API: `POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`.

A wire-format translation over the intake (`intake.py`): the request's `instructions`,
`input` items (and, with `previous_response_id`, the stored conversation before them)
become chat messages, its function `tools`, `tool_choice` and `text.format` the chat
fields (`responses_request.py`), so tool calling, reasoning, constraints, sampling,
admission and aborts are the Chat Completions route's. The output comes back as Responses
items (`reasoning`, `message` with `output_text`, `function_call`), streamed as the
documented events, each with its `sequence_number` and named by its type.

Differences from api.openai.com: one model is served (any `model` name is accepted); only
function tools; `background`, `include`, `truncation: "auto"` and non-text input are a 400;
`reasoning` needs a model with a reasoning parser (its effort does not change the budget);
function tools are strict unless `strict: false` (the Responses default); the store is in
memory (`responses_store.py`). Not OpenAI's: `max_output_tokens` may be below 16.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from radixlm.server.errors import ApiError
from radixlm.server.generation import abandon, open_streams, run_calls
from radixlm.server.intake import (
    ChatIntake,
    admit_chat,
    chat_deltas,
    chat_output,
    reasoning_counts,
    usage,
)
from radixlm.server.protocol import ChatCompletionRequest
from radixlm.server.reasoning import reasoning_parser_name
from radixlm.server.responses_request import (
    ReasoningConfig,
    ResponsesRequest,
    bad_request,
    chat_messages,
    chat_request,
    check_supported,
    input_items,
    new_id,
    remap_error,
)
from radixlm.server.responses_store import ResponseStore, owner_of, store_of
from radixlm.server.state import ServerState, get_state, logger
from radixlm.server.streaming import SSEResponse

router = APIRouter(prefix="/v1")


# ---------------------------------------------------------------- output items and events


class OutputItems:
    """A response's output items as they grow, and the stream events that grow them
    (`drain`, without sequence numbers). Text, reasoning and calls each go into the open
    item of their kind, else a new one (the one before is done); the non-streamed route
    feeds the whole output at once, so both answer the same items."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def drain(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def _emit(self, kind: str, **fields: Any) -> None:
        self._events.append({"type": kind, **copy.deepcopy(fields)})

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        # only the open item is written to, and it is always the last one
        return {"item_id": item["id"], "output_index": len(self.items) - 1}

    def _start(self, item: dict[str, Any], part: dict[str, Any] | None) -> None:
        self.close("completed")
        self.items.append(item)
        self._open = item
        self._emit("response.output_item.added", output_index=len(self.items) - 1, item=item)
        if part is not None:
            item["content"].append(part)
            self._emit("response.content_part.added", **self._where(item), content_index=0,
                       part=part)

    def _writing(self, kind: str) -> dict[str, Any] | None:
        return self._open if self._open is not None and self._open["type"] == kind else None

    def reasoning(self, text: str) -> None:
        if not text:
            return
        item = self._writing("reasoning")
        if item is None:
            item = {"type": "reasoning", "id": new_id("reasoning"), "summary": [],
                    "content": [], "status": "in_progress"}
            self._start(item, {"type": "reasoning_text", "text": ""})
        item["content"][0]["text"] += text
        self._emit("response.reasoning_text.delta", **self._where(item), content_index=0,
                   delta=text)

    def text(self, text: str, force: bool = False) -> None:
        if not text and not force:
            return
        item = self._writing("message")
        if item is None:
            item = {"type": "message", "id": new_id("message"), "status": "in_progress",
                    "role": "assistant", "content": []}
            self._start(item, {"type": "output_text", "text": "", "annotations": [],
                               "logprobs": []})
        if text:
            item["content"][0]["text"] += text
            self._emit("response.output_text.delta", **self._where(item), content_index=0,
                       delta=text, logprobs=[])

    def call(self, delta: dict[str, Any]) -> None:
        """One OpenAI tool-call delta (`ToolCallStream`): a first one with the call's id and
        name opens its item, argument fragments extend it."""
        fn = delta.get("function") or {}
        if delta.get("id"):
            self._start({"type": "function_call", "id": new_id("function_call"),
                         "call_id": delta["id"], "name": fn.get("name", ""), "arguments": "",
                         "status": "in_progress"}, None)
        item = self._writing("function_call")
        if item is not None and fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            self._emit("response.function_call_arguments.delta", **self._where(item),
                       delta=fn["arguments"])

    def close(self, status: str) -> None:
        """End the open item with ``status``."""
        item, self._open = self._open, None
        if item is None:
            return
        where = self._where(item)
        if item["type"] == "function_call":
            self._emit("response.function_call_arguments.done", **where,
                       arguments=item["arguments"])
        else:
            part = item["content"][0]
            if item["type"] == "message":
                self._emit("response.output_text.done", **where, content_index=0,
                           text=part["text"], logprobs=[])
            else:
                self._emit("response.reasoning_text.done", **where, content_index=0,
                           text=part["text"])
            self._emit("response.content_part.done", **where, content_index=0, part=part)
        item["status"] = status
        self._emit("response.output_item.done", output_index=where["output_index"], item=item)

    def finish(self, status: str) -> None:
        """End the output; one that has no message and no call gets an empty message."""
        if not any(i["type"] in ("message", "function_call") for i in self.items):
            self.text("", force=True)
        self.close(status)


# ---------------------------------------------------------------- the response object


def _echo(body: ResponsesRequest, chat: ChatCompletionRequest, intake: ChatIntake,
          state: ServerState) -> dict[str, Any]:
    """The fields of the response object that restate the request (the sampling values as
    the engine takes them)."""
    params = intake.calls[0].params
    tools = [{"type": "function", "name": t["function"]["name"],
              "description": t["function"].get("description"),
              "parameters": t["function"].get("parameters"), "strict": t["function"]["strict"]}
             for t in chat.tools or ()]
    fmt = body.text.format if body.text is not None and body.text.format else None
    text_format = fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
    reasoning = body.reasoning or ReasoningConfig()
    return {"model": state.model_id, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
            "parallel_tool_calls": chat.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key, "reasoning": reasoning.model_dump(),
            "store": body.store is not False,
            "temperature": params.temperature if params else body.temperature,
            "top_p": params.top_p if params else body.top_p,
            "text": {"format": text_format}, "tools": tools,
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "truncation": "disabled", "user": body.user, "background": False}


def _usage(intake: ChatIntake, state: ServerState,
           results: list[dict[str, Any]]) -> dict[str, Any]:
    """The Responses usage of a one-call intake (the chat usage under its names)."""
    u = usage(results, 1, reasoning_counts(intake.reasoning, state, intake.calls, results))
    return {"input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]
                                     ["cached_tokens"]},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": u.get(
                "completion_tokens_details", {}).get("reasoning_tokens", 0)},
            "total_tokens": u["total_tokens"]}


def _status(finish: str | None) -> tuple[str, dict[str, Any] | None]:
    """(status, incomplete_details) of a chat finish reason."""
    if finish in ("stop", "tool_calls"):
        return "completed", None
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "incomplete", {"reason": None}


class _Turn:
    """One request's response object as it goes from in progress to done, and where it
    is stored."""

    def __init__(self, body: ResponsesRequest, chat: ChatCompletionRequest,
                 intake: ChatIntake, state: ServerState, store: ResponseStore, owner: str,
                 conversation: list[dict[str, Any]]) -> None:
        self.head = {"id": f"resp_{intake.calls[0].rid}", "object": "response",
                     "created_at": int(time.time())}
        self.echo = _echo(body, chat, intake, state)
        self.intake, self.state = intake, state
        self.store = store if body.store is not False else None
        self.owner, self.conversation = owner, conversation

    def snapshot(self, status: str, output: list[dict[str, Any]] | None = None,
                 **fields: Any) -> dict[str, Any]:
        return {**self.head, "status": status, "error": None, "incomplete_details": None,
                **self.echo, "output": copy.deepcopy(output or []), "usage": None, **fields}

    def done(self, out: OutputItems, finish: str | None,
             results: list[dict[str, Any]]) -> dict[str, Any]:
        """The finished response (stored when `store`); ``out`` is finished with it."""
        status, details = _status(finish)
        out.finish("completed" if status == "completed" else "incomplete")
        response = self.snapshot(status, out.items, incomplete_details=details,
                                 usage=_usage(self.intake, self.state, results),
                                 completed_at=int(time.time()))
        if self.store is not None:
            self.store.put(self.owner, response, self.conversation)
        return response


# ---------------------------------------------------------------- routes


def _not_found(response_id: str, param: str = "response_id") -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", param=param,
                    code="not_found" if param == "response_id" else "previous_response_not_found")


@router.post("/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """Create a model response (streamed as events with `stream: true`)."""
    state = get_state(request)
    check_supported(body, reasoning_parser_name(state))
    store, owner = store_of(request.app), owner_of(request)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        earlier = store.get(body.previous_response_id, owner)
        if earlier is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        history = earlier.input_items + copy.deepcopy(earlier.response["output"])
    conversation = history + input_items(body.input, history)
    messages = chat_messages(body.instructions, conversation)
    if not messages:
        raise bad_request("input",
                          " is empty (and there are no instructions or earlier turns)")
    chat = chat_request(body, messages)
    try:
        intake = await admit_chat(state, chat, request.state.request_id)
    except ApiError as exc:
        raise remap_error(exc) from None
    turn = _Turn(body, chat, intake, state, store, owner, conversation)
    calls = intake.calls
    if body.stream:
        streams = await open_streams(state, calls)
        return SSEResponse(_events(turn, streams), on_close=lambda: abandon(state, calls),
                           stall_timeout=state.settings.stream_stall_timeout, named=True)
    results = await run_calls(state, calls, request)
    result = chat_output(intake, state, 0, results[0])
    out = OutputItems()
    out.reasoning(result.reasoning or "")
    out.text(result.content or "")
    for i, call in enumerate(result.tool_calls):
        out.call({"index": i, "id": call["id"], "function": call["function"]})
    return JSONResponse(turn.done(out, result.finish, results))


async def _events(turn: _Turn, streams: list[Any]) -> AsyncIterator[dict[str, Any]]:
    """The response's stream events, numbered; an error once the stream has started is an
    `error` event and `response.failed`."""
    seq = itertools.count()
    out = OutputItems()
    yield {"type": "response.created", "sequence_number": next(seq),
           "response": turn.snapshot("in_progress")}
    yield {"type": "response.in_progress", "sequence_number": next(seq),
           "response": turn.snapshot("in_progress")}
    finish, final = None, None
    try:
        async for d in chat_deltas(turn.state, turn.intake, streams):
            out.reasoning(d.reasoning)
            out.text(d.content)
            for call in d.tool_calls:
                out.call(call)
            if d.finish is not None:
                finish, final = d.finish, d.chunk
            for event in out.drain():
                yield {**event, "sequence_number": next(seq)}
    except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
        if not isinstance(exc, ApiError):
            logger.exception("stream failed")
            exc = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
        yield {"type": "error", "sequence_number": next(seq), "code": exc.code or exc.type,
               "message": exc.message, "param": exc.param}
        error = {"code": "server_error" if exc.status >= 500 else "invalid_prompt",
                 "message": exc.message}
        yield {"type": "response.failed", "sequence_number": next(seq),
               "response": turn.snapshot("failed", out.items, error=error)}
        return
    response = turn.done(out, finish, [final] if final is not None else [])
    for event in out.drain():
        yield {**event, "sequence_number": next(seq)}
    kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
    yield {"type": kind, "sequence_number": next(seq), "response": response}


@router.get("/responses/{response_id}")
async def get_response(response_id: str, request: Request,
                       stream: bool = False) -> dict[str, Any]:
    """A stored response (made with the same API key)."""
    if stream:
        raise ApiError(400, "stream: replaying a response is not supported by this server",
                       param="stream")
    entry = store_of(request.app).get(response_id, owner_of(request))
    if entry is None:
        raise _not_found(response_id)
    return entry.response


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    """Forget a stored response."""
    if not store_of(request.app).delete(response_id, owner_of(request)):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, limit: int = 20,
                           order: Literal["asc", "desc"] = "desc",
                           after: str | None = None) -> dict[str, Any]:
    """The conversation items that went into a stored response's prompt (earlier turns
    included), ``order`` desc (newest first) by default, ``limit`` 1-100 after item
    ``after``."""
    if not 1 <= limit <= 100:
        raise ApiError(400, f"limit: must be between 1 and 100, got {limit}", param="limit")
    entry = store_of(request.app).get(response_id, owner_of(request))
    if entry is None:
        raise _not_found(response_id)
    items = entry.input_items if order == "asc" else entry.input_items[::-1]
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in this response",
                           param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
