"""The Responses API's stored responses (`store: true`): what `GET /v1/responses/{id}`,
`input_items` and a later request's `previous_response_id` read.

In memory, per app, bounded in count and in bytes (the JSON size of what is kept), least
recently used out first; a response larger than the whole byte budget is not kept. Each
entry belongs to the API key that made it (a digest of it, never the key): another key
reads it as absent. Used from the event loop only (no lock).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request

MAX_RESPONSES = 1024
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class StoredResponse:
    """A response object as it was answered, and the conversation items that went into
    its prompt (earlier turns first, each with an ``id``)."""

    owner: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    size: int


class ResponseStore:
    """An LRU map of response id -> `StoredResponse`, at most ``max_items`` entries and
    ``max_bytes`` bytes of JSON in all."""

    def __init__(self, max_items: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError("max_items and max_bytes must be >= 1")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, response: dict[str, Any],
            input_items: list[dict[str, Any]]) -> bool:
        """Keep ``response`` (under its ``id``) for ``owner``, evicting the least recently
        used entries to make room; False when it alone exceeds the byte budget."""
        size = len(json.dumps([response, input_items], ensure_ascii=False).encode())
        self._drop(response["id"])
        if size > self.max_bytes:
            return False
        while self._entries and (len(self._entries) >= self.max_items
                                 or self.bytes + size > self.max_bytes):
            self._drop(next(iter(self._entries)))
        self._entries[response["id"]] = StoredResponse(owner, response, input_items, size)
        self.bytes += size
        return True

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The entry if ``owner`` made it (and marks it recently used), else None."""
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str, owner: str) -> bool:
        """Drop the entry if ``owner`` made it; whether there was one."""
        if self.get(response_id, owner) is None:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size


def store_of(app: FastAPI) -> ResponseStore:
    """The app's store (made on first use; a test may set ``app.state.responses`` to one
    with other bounds before serving)."""
    store = getattr(app.state, "responses", None)
    if store is None:
        store = app.state.responses = ResponseStore()
    return store


def owner_of(request: Request) -> str:
    """Who a request speaks for: a digest of its API key (Bearer, else x-api-key; "" for
    none). With --api-key every accepted request has the server's key; without one, each
    client's own key keeps its responses apart."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    key = token.strip() if scheme.lower() == "bearer" else ""
    key = key or request.headers.get("x-api-key", "")
    return hashlib.sha256(key.encode()).hexdigest() if key else ""
