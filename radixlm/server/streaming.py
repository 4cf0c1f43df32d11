"""Server-sent events: `data: {json}\\n\\n` lines ending with `data: [DONE]\\n\\n`; or,
for protocols that name their events (OpenAI Responses), `event: <type>` before each data
line and no end marker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixlm.server.errors import ApiError
from radixlm.server.state import logger

SSE_DONE = "[DONE]"


class StreamError(RuntimeError):
    """An error event in a stream (its message is the server's)."""


def sse_event(line: str) -> dict[str, Any] | str | None:
    """What one line of an SSE stream carries, for clients: its JSON event, `SSE_DONE` at
    the end marker, None for a line without data. An error event raises StreamError."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == SSE_DONE:
        return SSE_DONE
    event = json.loads(data)
    if isinstance(event, dict) and "error" in event:
        error = event["error"]
        raise StreamError(error.get("message", str(error)) if isinstance(error, dict)
                          else str(error))
    return event


def sse(payload: dict[str, Any] | str, named: bool = False) -> bytes:
    """One SSE event; ``named``: with an `event:` line holding the payload's "type"."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    name = payload.get("type") if named and isinstance(payload, dict) else None
    return (f"event: {name}\n" if isinstance(name, str) else "").encode() \
        + f"data: {data}\n\n".encode()


async def sse_events(events: AsyncIterator[dict[str, Any]],
                     named: bool = False) -> AsyncIterator[bytes]:
    """Encode `events`; an ApiError mid-stream becomes an error event; ends in [DONE]
    unless ``named`` (each event then also named by its "type", as `sse` writes it)."""
    try:
        async for event in events:
            yield sse(event, named)
    except ApiError as exc:
        yield sse(exc.body())
    except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
        logger.exception("stream failed")
        yield sse(ApiError(500, f"internal error: {type(exc).__name__}: {exc}").body())
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    if not named:
        yield sse("[DONE]")


class ClientStalled(Exception):
    """The client stopped reading the stream for longer than the stall timeout."""


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always closes its event source, so a client that
    disconnects has its requests aborted at once rather than when the generator is
    garbage-collected. `on_close` runs last (it aborts what the events never reached);
    a send that waits more than `stall_timeout` seconds on a client that does not read
    ends the response (the engine buffers only the latest cumulative chunk meanwhile).
    ``named``: events named by their "type", no [DONE] (`sse_events`)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[dict[str, Any]],
                 headers: dict[str, str] | None = None,
                 on_close: Callable[[], None] | None = None,
                 stall_timeout: float | None = None, named: bool = False) -> None:
        self._events = events
        self._on_close = on_close
        self._stall_timeout = stall_timeout
        super().__init__(sse_events(events, named), headers={"Cache-Control": "no-cache",
                                                      "X-Accel-Buffering": "no",
                                                      **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded_send(message: Any) -> None:
            try:
                await asyncio.wait_for(send(message), self._stall_timeout)
            except TimeoutError:
                raise ClientStalled(
                    f"the client read nothing for {self._stall_timeout} s") from None

        try:
            await super().__call__(scope, receive, bounded_send)
        except ClientStalled as exc:
            logger.warning("stream dropped: %s", exc)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._events.aclose()  # type: ignore[attr-defined]
            if self._on_close is not None:
                self._on_close()
