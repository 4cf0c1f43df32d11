"""Run the HTTP server in this process: load the engine, serve with uvicorn, shut down
gracefully on SIGTERM/SIGINT (stop accepting, let in-flight requests finish until
`shutdown_timeout`, abort the rest, stop the engine, exit 0). If the engine's thread dies,
the server goes down the same way and exits 1 (a supervisor restarts it; never a hang)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings, ServerState

logger = logging.getLogger("radixlm.server")


class _Server(uvicorn.Server):
    """uvicorn.Server that flags the app as shutting down as soon as a signal arrives
    (/health turns 503, new generation requests get 503)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self._state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._state.shutting_down = True
        logger.info("signal %s: shutting down (deadline %.0f s)", sig,
                    self._state.settings.shutdown_timeout)
        super().handle_exit(sig, frame)


def _watch_engine(server: uvicorn.Server, state: ServerState, done: threading.Event,
                  died: list[bool], period_s: float = 0.5) -> None:
    """Until `done`: when the engine stops being alive, flag it and stop the server."""
    while not done.wait(period_s):
        if not state.engine_alive and not state.shutting_down:
            logger.critical("the engine thread has died: shutting the server down")
            died.append(True)
            state.shutting_down = True
            server.should_exit = True
            return


def setup_logging(level: str) -> None:
    """Plain one-line logs on stderr; request logs are JSON objects in the message."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve(engine_kwargs: dict[str, Any], settings: ServerSettings, log_level: str = "info",
          engine_factory: Callable[..., Any] | None = None) -> int:
    """Load an Engine with `engine_kwargs` (None values mean default) and serve it until a
    signal arrives. Returns the process exit code. `engine_factory` replaces the Engine
    class (tests serve a fake engine this way)."""
    setup_logging(log_level)
    if engine_factory is None:
        from radixlm.runtime.engine import Engine  # heavy import, only when serving

        engine_factory = Engine
    kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
    logger.info("loading engine: %s", kwargs)
    try:
        engine = engine_factory(**kwargs)
    except ValueError as exc:  # a bad option: say so without a traceback
        logger.error("cannot start the engine: %s", exc)
        return 2
    try:
        app = create_app(engine, settings)
        config = uvicorn.Config(app, host=settings.host, port=settings.port,
                                log_level=log_level.lower(), access_log=False,
                                timeout_graceful_shutdown=int(max(settings.shutdown_timeout, 1)),
                                lifespan="on")
        server = _Server(config, app.state.server)
        # uvicorn re-raises the captured signal after its graceful shutdown; with these
        # handlers in place that re-raise is a no-op and we return 0 instead of dying by it.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        logger.info("serving %s on http://%s:%d", engine.model_name, settings.host,
                    settings.port)
        done, died = threading.Event(), []
        watchdog = threading.Thread(target=_watch_engine, name="radixlm-engine-watchdog",
                                    args=(server, app.state.server, done, died), daemon=True)
        watchdog.start()
        try:
            server.run()
        finally:
            done.set()
        if not server.started:
            logger.error("the server failed to start (is port %d free?)", settings.port)
            return 1
    finally:
        engine.shutdown()
    if died:
        logger.error("server stopped: the engine died")
        return 1
    logger.info("server stopped")
    return 0
