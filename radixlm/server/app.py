"""The FastAPI app: routes, error handlers, and the guard middleware (request ids, API key,
body size cap, access log, HTTP metrics).

`create_app(engine, settings)` does not own the engine: whoever made it shuts it down
(`launch.serve` does, after uvicorn's graceful shutdown).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.server import (
    embeddings_api,
    messages_api,
    native,
    ollama_api,
    openai_api,
    playground,
    responses_api,
)
from radixlm.server.errors import AnthropicError, ApiError, OllamaError
from radixlm.server.generation import ClientDisconnected
from radixlm.server.metrics import ServerMetrics
from radixlm.server.state import ServerSettings, ServerState, get_state, logger
from radixlm.server.validation import PrepPool

# answered without the API key (the playground page: every call it makes sends the key)
OPEN_PATHS = frozenset({"/health"}) | playground.OPEN_PATHS


def create_app(engine: Any, settings: ServerSettings | None = None) -> FastAPI:
    """Build the app serving `engine` (anything following docs/ENGINE_API.md)."""
    settings = settings or ServerSettings()
    state = ServerState(engine=engine, settings=settings,
                        metrics=ServerMetrics(engine.get_stats),
                        prep=PrepPool(settings.prep_workers, settings.max_pending_prep))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.shutting_down = True
        for rid in sorted(state.inflight):  # left over after the graceful-shutdown deadline
            state.abort(rid)
        state.prep.shutdown()

    app = FastAPI(title="radixlm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    app.include_router(native.router)
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(messages_api.router)
    app.include_router(embeddings_api.router)
    app.include_router(ollama_api.router)
    app.include_router(playground.router)
    app.add_api_route("/metrics", _metrics, methods=["GET"], include_in_schema=False)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnected, _disconnected)
    app.add_exception_handler(UnicodeError, _unicode_error)
    routers = (native.router, openai_api.router, responses_api.router, messages_api.router,
               embeddings_api.router,
               ollama_api.router, playground.router)
    known = {"/metrics", *OPEN_PATHS} | {r.path for router in routers
                                         for r in router.routes if hasattr(r, "path")}
    app.add_middleware(GuardMiddleware, state=state, known_paths=known)
    return app


async def _metrics(request: Request) -> Response:
    # rendering reads engine.get_stats(), which waits for the scheduler thread: not on the loop
    body = await asyncio.to_thread(get_state(request).metrics.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    get_state(request).metrics.count_error(exc)
    return _error_response(exc)


async def _unicode_error(request: Request, exc: Exception) -> Response:
    """Text that cannot be encoded (a lone surrogate escape such as "\\ud800") reached a
    place that encodes it: the client's input, so a 400."""
    return await _api_error(request, ApiError(
        400, f"the request contains text that is not valid Unicode: {exc}"))


async def _validation_error(request: Request, exc: Exception) -> Response:
    """Pydantic errors -> 400 naming the field (OpenAI's wording for unknown fields)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    # drop "body" and the union-branch tags pydantic puts in locations ("list[Model]",
    # "Model", "constrained-str")
    loc = [str(x) for x in first.get("loc", ()) if x != "body"
           and not (isinstance(x, str) and (x[:1].isupper() or "[" in x or "-" in x))]
    field = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        msg = f"Unrecognized request argument supplied: {field}"
    elif kind == "json_invalid":
        msg = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
        field = None
    elif kind == "missing":
        msg = f"missing required field '{field}'"
    else:
        detail = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        msg = f"{field}: {detail}" if field else detail
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more error(s))"
    return await _api_error(request, ApiError(400, msg, param=field))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error = ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    if request.url.path.startswith(ollama_api.PATH):  # e.g. /api/pull: 404 in Ollama's shape
        error = OllamaError.of(error)
    return _error_response(error)


async def _disconnected(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it; the requests were aborted


class GuardMiddleware:
    """Pure ASGI middleware (streaming and disconnects pass through untouched):
    request id (X-Request-Id), API key (Bearer or x-api-key), body size cap (413), access log,
    metrics; errors under `/v1/messages` in Anthropic's shape, under `/api/` in Ollama's."""

    def __init__(self, app: ASGIApp, state: ServerState, known_paths: set[str]) -> None:
        self.app = app
        self.state = state
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        status = [0]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            error = self._check_auth(scope["path"], headers)
            if error is None:
                receive, error = await self._read_body(scope, receive, headers)
            if error is not None:
                if scope["path"].startswith(messages_api.PATH):  # in Anthropic's shape
                    error = AnthropicError.of(error)
                elif scope["path"].startswith(ollama_api.PATH):  # in Ollama's
                    error = OllamaError.of(error)
                self.state.metrics.count_error(error)
                await _error_response(error)(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            self._record(scope, headers, request_id, status[0], time.perf_counter() - t0)

    def _check_auth(self, path: str, headers: dict[str, str]) -> ApiError | None:
        key = self.state.settings.api_key
        if key is None or path in OPEN_PATHS:
            return None
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              key.encode()):
            return None
        if hmac.compare_digest(headers.get("x-api-key", "").strip().encode(), key.encode()):
            return None  # the header Anthropic's clients send
        return ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>' or "
                             "'x-api-key: <key>')",
                        code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _read_body(self, scope: Scope, receive: Receive,
                         headers: dict[str, str]) -> tuple[Receive, ApiError | None]:
        """Buffer the body up to the cap; replay it to the app, then pass receive through.
        A JSON body sent without a JSON content type (`curl -d '{...}'`) is read as JSON."""
        cap = self.state.settings.max_body_bytes
        too_big = ApiError(413, f"the request body exceeds {cap} bytes", code="body_too_large")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cap:
            return receive, too_big
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # a disconnect: let the app see it
                chunks.append(b"")
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > cap:
                return receive, too_big
        body, sent = b"".join(chunks), [False]
        if "json" not in headers.get("content-type", "") and body.lstrip()[:1] in (b"{", b"["):
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))

        async def replay() -> Message:
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, None

    def _record(self, scope: Scope, headers: dict[str, str], request_id: str, status: int,
                seconds: float) -> None:
        path = scope["path"]
        route = path if path in self.known_paths else "other"
        self.state.metrics.http_requests.labels(method=scope["method"], route=route,
                                                status=str(status)).inc()
        if path in ("/health", "/metrics"):
            return
        logger.info(json.dumps({
            "event": "http_request", "request_id": request_id,
            "client_request_id": headers.get("x-request-id"), "method": scope["method"],
            "path": path, "status": status, "duration_ms": round(seconds * 1000, 2),
            "client": (scope.get("client") or ("", 0))[0]}))
