"""Ollama's API: `GET /api/version`, `/api/tags`, `/api/ps`, `POST /api/show`, `/api/chat`,
`/api/generate`, `/api/embed`, `/api/embeddings` (the `ollama` client with `host` the
server's root).

A wire-format translation over the intake (`intake.py`): a chat or generate body becomes the
Chat Completions request it means (`ollama_request.py`), so tools, reasoning, grammars,
sampling, admission (429) and aborts are the chat route's; a `raw` generate sends its prompt
untemplated, as `/v1/completions` does. Answers are Ollama's: streamed (the default) as
NDJSON lines (`application/x-ndjson`), each `{"model", "created_at", "message" | "response",
"done": false}`, the last with `done_reason` (stop / length), token counts and durations in
nanoseconds (`prompt_eval_duration` is the time to the first token, `eval_duration` the rest
of the engine's time, `load_duration` what came before the engine); `stream: false` answers
one such object. Tool calls come whole, arguments as objects; thinking (with a reasoning
parser) in `thinking`. A body without messages (or prompt) answers `done_reason` "load".
Errors are `{"error": "message"}` with the HTTP status (in-band as a line once a stream has
started); a stream's first chunk is awaited before the response starts, so a grammar that
does not compile is still a 400 naming `format`. Embeddings (`ollama_embed.py`) are engine
encode requests, with generation's admission and aborts too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from radixlm.server.errors import ApiError, OllamaError
from radixlm.server.generation import admit
from radixlm.server.intake import (
    ChatIntake,
    admit_chat,
    chat_top_logprobs,
    fan_out,
    openai_sampling,
)
from radixlm.server.messages_request import validation_message
from radixlm.server.ollama_embed import EmbedBody, EmbeddingsBody, embed_answer, embed_inputs
from radixlm.server.ollama_models import model_entry, running_entry, show
from radixlm.server.ollama_reply import Reply, answer, loaded
from radixlm.server.ollama_request import (
    ChatBody,
    GenerateBody,
    ShowBody,
    chat_request,
    check_model,
    generate_request,
    remap_error,
)
from radixlm.server.protocol import ChatCompletionRequest
from radixlm.server.reasoning import reasoning_parser_name, reasoning_setup
from radixlm.server.state import ServerState, get_state

PATH = "/api/"  # the paths under it answer errors in Ollama's shape
VERSION = "0.12.0"  # the Ollama API version these routes follow, for clients that check it
_NAMED = re.compile(r"[\w.\[\]]+: ")  # a message that starts with the field it names


class OllamaRoute(APIRoute):
    """A route whose errors (body validation included) are answered in Ollama's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def ollama_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise OllamaError(400, _message(exc.errors())) from None
            except ApiError as exc:
                raise remap_error(exc) from None
            except UnicodeError as exc:
                raise OllamaError(400, "the request contains text that is not valid "
                                  f"Unicode: {exc}") from None

        return ollama_handler


def _message(errors: Any) -> str:
    """Pydantic's errors as one message; a check's own message already names its field."""
    first = errors[0] if errors else {}
    detail = str(first.get("msg", "")).removeprefix("Value error, ")
    named = first.get("type") == "value_error" and _NAMED.match(detail)
    return detail if named else validation_message(errors)


router = APIRouter(prefix="/api", route_class=OllamaRoute)


# ---------------------------------------------------------------- the model


@router.get("/version")
async def version() -> dict[str, Any]:
    return {"version": VERSION}


@router.get("/tags")
async def tags(request: Request) -> dict[str, Any]:
    """The one served model."""
    return {"models": [model_entry(get_state(request))]}


@router.get("/ps")
async def running(request: Request) -> dict[str, Any]:
    """The one served model, loaded for good."""
    return {"models": [running_entry(get_state(request))]}


@router.post("/show")
async def show_model(body: ShowBody, request: Request) -> dict[str, Any]:
    state = get_state(request)
    check_model(state, body.model or body.name or "")
    return show(state)


@router.post("/chat")
async def chat(body: ChatBody, request: Request) -> Response:
    """A chat turn (streamed unless `stream: false`)."""
    t0, state = time.perf_counter(), get_state(request)
    check_model(state, body.model)
    if not body.messages:
        return loaded(state, chat=True)
    chat_body = chat_request(body, state, reasoning_parser_name(state))
    try:
        intake = await admit_chat(state, chat_body, request.state.request_id)
        return await answer(state, Reply(state, intake, True, bool(body.logprobs), t0),
                            request, body.stream)
    except ApiError as exc:
        raise remap_error(exc, body.format) from None


@router.post("/generate")
async def generate(body: GenerateBody, request: Request) -> Response:
    """A completion of `prompt` (templated as a user turn after `system`, or `raw`)."""
    t0, state = time.perf_counter(), get_state(request)
    check_model(state, body.model)
    if not body.prompt:
        return loaded(state, chat=False)
    chat_body = generate_request(body, state, reasoning_parser_name(state))
    try:
        if body.raw:
            intake = await _admit_raw(state, body.prompt, chat_body, request.state.request_id)
        else:
            intake = await admit_chat(state, chat_body, request.state.request_id)
        return await answer(state, Reply(state, intake, False, bool(body.logprobs), t0),
                            request, body.stream)
    except ApiError as exc:
        raise remap_error(exc, body.format) from None


@router.post("/embed")
async def embed(body: EmbedBody, request: Request) -> dict[str, Any]:
    """One unit vector per input, in order."""
    t0, state = time.perf_counter(), get_state(request)
    check_model(state, body.model)
    texts = [body.input] if isinstance(body.input, str) else body.input
    results = await embed_inputs(state, request, texts, "input", body.options, body.truncate,
                                 body.dimensions or None)
    return embed_answer(state, results, t0)


@router.post("/embeddings")
async def embeddings(body: EmbeddingsBody, request: Request) -> dict[str, Any]:
    """Ollama's older route: the vector of one `prompt` (not truncated)."""
    state = get_state(request)
    check_model(state, body.model)
    [out] = await embed_inputs(state, request, [body.prompt], "prompt", body.options, False)
    return {"embedding": out["embedding"]}


async def _admit_raw(state: ServerState, prompt: str, chat_body: ChatCompletionRequest,
                     request_id: str) -> ChatIntake:
    """The prompt as it is (no template), with the chat request's sampling fields, admitted
    as `/v1/completions` admits a prompt; no max tokens means the rest of the context."""
    top = chat_top_logprobs(chat_body)
    sampling = openai_sampling(chat_body, chat_body.max_new_tokens)
    sampling.setdefault("max_new_tokens", state.context_len)  # admit clamps it to the room
    calls = fan_out(chat_body, [(prompt, None)], sampling, top, request_id)
    await admit(state, calls)
    return ChatIntake(calls, None, False, reasoning_setup(state, True))
