"""Server settings and the per-app state object routes read."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from radixlm.server.validation import max_prompt_bytes

logger = logging.getLogger("radixlm.server")


def is_loopback(host: str | None) -> bool:
    """True for a loopback address or `localhost`."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """HTTP-layer settings (the engine has its own EngineConfig)."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # Bearer key required on every route but /health
    max_queued_requests: int | None = None  # server-side bound (the engine has its own)
    request_timeout: float | None = 600.0  # seconds per request; abort + 504 when exceeded
    max_body_bytes: int = 32 * 1024 * 1024  # larger bodies get 413
    served_model_name: str | None = None  # /v1/models id; default: engine.model_name
    shutdown_timeout: float = 30.0  # graceful-shutdown deadline before in-flight aborts
    retry_after_s: int = 1  # Retry-After on 429
    prep_workers: int = 2  # threads that tokenize and validate requests off the event loop
    max_pending_prep: int = 256  # requests waiting for those threads; more get 429
    stream_stall_timeout: float = 30.0  # a stream client not reading this long is dropped
    # the playground's /radix_tree: prompt text shown (only keyless on loopback), byte cap
    playground_show_text: bool = False
    radix_tree_max_bytes: int = 512 * 1024

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError("request_timeout must be > 0")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError("max_queued_requests must be >= 0")
        if self.prep_workers < 1 or self.max_pending_prep < 1:
            raise ValueError("prep_workers and max_pending_prep must be >= 1")
        if self.stream_stall_timeout <= 0:
            raise ValueError("stream_stall_timeout must be > 0")
        if self.radix_tree_max_bytes < 1024:
            raise ValueError("radix_tree_max_bytes must be >= 1024")
        if self.playground_show_text and (self.api_key is not None
                                          or not is_loopback(self.host)):
            raise ValueError("--playground-show-text shows users' prompts: it needs a server "
                             "without --api-key bound to a loopback address (e.g. --host "
                             f"127.0.0.1); this one has host {self.host!r}"
                             + (" and an API key" if self.api_key is not None else ""))


@dataclass
class ServerState:
    """Everything a route needs; stored on `app.state.server`."""

    engine: Any
    settings: ServerSettings
    metrics: Any  # metrics.ServerMetrics
    prep: Any  # validation.PrepPool
    inflight: set[str] = field(default_factory=set)  # rids the server is waiting on
    shutting_down: bool = False
    _max_prompt_bytes: int | None = None

    @property
    def engine_alive(self) -> bool:
        """False once the engine's worker thread has died (engines without
        `is_alive()` are taken to be alive)."""
        is_alive = getattr(self.engine, "is_alive", None)
        return True if is_alive is None else bool(is_alive())

    @property
    def max_prompt_bytes(self) -> int:
        """No prompt longer than this in UTF-8 bytes fits the context (computed once)."""
        if self._max_prompt_bytes is None:
            self._max_prompt_bytes = max_prompt_bytes(self.engine.tokenizer, self.context_len)
        return self._max_prompt_bytes

    @property
    def model_id(self) -> str:
        """The model name shown in /v1 responses."""
        return self.settings.served_model_name or str(getattr(self.engine, "model_name", "default"))

    @property
    def context_len(self) -> int:
        """Max tokens of prompt + output."""
        return int(self.engine.context_len)

    def abort(self, rid: str) -> None:
        """Ask the engine to abort `rid`; never raises (the request may be gone already)."""
        try:
            self.engine.abort(rid)
        except Exception:  # noqa: BLE001 - best effort; log and carry on
            logger.exception("engine.abort(%s) failed", rid)


def get_state(request: Request) -> ServerState:
    """The ServerState of the app serving `request`."""
    return request.app.state.server
