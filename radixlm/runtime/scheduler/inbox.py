"""The inbox: how other threads reach the scheduler thread.

Other threads only ever put messages here (``submit``, ``abort``, ``call``, the stop
wake-up); the scheduler thread takes them between steps, so every request and queue is
read and written by that one thread.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from radixlm.runtime.request import Req
from radixlm.runtime.scheduler.state import SchedulerState


class Inbox:
    """Messages ``(kind, payload)`` to the scheduler thread: ``("add", req)``, ``("abort",
    rid)``, ``("call", (fn, done))`` (run ``fn``, put ``(ok, value)`` on ``done``) and
    ``("wake", None)``.

    Owns: the message queue (``put`` is the only method other threads may call).
    May mutate: through ``add`` and ``finish``, the queues and ``by_rid`` of ``state``.
    Returns: nothing; a call's result goes to its ``done`` queue.
    Invariants: messages are handled in the order they were put; after ``fail_all`` every
    request held or still in the queue has had its final output, and every waiting caller
    of a ``call`` an error.
    """

    def __init__(self, state: SchedulerState, add: Callable[[Req], None],
                 finish: Callable[..., None]) -> None:
        """``add(req)`` takes a submitted request in; ``finish(req, reason, insert=True)``
        ends one."""
        self.queue: queue.Queue = queue.Queue()
        self.state = state
        self._add = add
        self._finish = finish

    def put(self, kind: str, payload) -> None:
        self.queue.put((kind, payload))

    def drain(self, block: bool) -> None:
        """Handle every message there is (``block``: first wait up to 50 ms for one)."""
        try:
            msg = self.queue.get(timeout=0.05) if block else self.queue.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = msg
            if kind == "add":
                self._add(payload)
            elif kind == "abort":
                self._abort(payload)
            elif kind == "call":
                fn, done = payload
                try:
                    done.put((True, fn()))
                except Exception as e:  # report to the caller
                    done.put((False, e))
            try:
                msg = self.queue.get_nowait()
            except queue.Empty:
                return

    def _abort(self, rid: str) -> None:
        req = self.state.by_rid.get(rid)
        if req is not None and not req.finished:
            self._finish(req, {"type": "abort", "message": "aborted by request"})

    def fail_all(self, reason: dict) -> None:
        """End every request held or still in the inbox with `reason` (shutdown, death)."""
        for req in list(self.state.by_rid.values()):
            self._finish(req, dict(reason), insert=False)
        while True:
            try:
                kind, payload = self.queue.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._finish(payload, dict(reason), insert=False)
            elif kind == "call":
                payload[1].put((False, RuntimeError(reason["message"])))
