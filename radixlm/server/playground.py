"""The playground: a web page at `/` (static files shipped in the package, no build step, no
CDN) and the JSON view of the radix tree it draws, `GET /radix_tree`.

The page itself and its two assets are served without the API key (`OPEN_PATHS`); every
call the page makes (`/v1/...`, `/metrics`, `/radix_tree`) needs it like any other route.

`/radix_tree` is bounded: at most `max_nodes` nodes (<= `MAX_NODES`) and `max_bytes` bytes
of JSON (<= `ServerSettings.radix_tree_max_bytes`); what does not fit is left out and
`truncated` says so. Prompts are users' data: a node shows its token count and its first
token ids, and its text only when the server was started with `--playground-show-text`,
which `ServerSettings` accepts only without an API key on a loopback address, and only to
clients on loopback.
"""

from __future__ import annotations

import asyncio
import json
import queue
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request, Response

from radixlm.server.errors import ApiError
from radixlm.server.state import ServerState, get_state, is_loopback

router = APIRouter()

# name under /playground/ -> media type
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
OPEN_PATHS = frozenset({"/", *(f"/playground/{name}" for name in ASSETS)})
MAX_NODES = 5000
DEFAULT_NODES = 256
IDS_PER_NODE = 16  # token ids shown per node
TEXT_TOKENS = 48  # tokens decoded per node when text is shown


@cache
def _static(name: str) -> bytes:
    """A file of `radixlm/server/static/` (read once)."""
    return (resources.files("radixlm.server") / "static" / name).read_bytes()


@router.get("/", include_in_schema=False)
async def index() -> Response:
    """The playground page."""
    return Response(_static("index.html"), media_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "no-cache"})


@router.get("/playground/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    """The page's script and style sheet."""
    if name not in ASSETS:
        raise ApiError(404, f"no playground file {name!r}")
    return Response(_static(name), media_type=ASSETS[name],
                    headers={"Cache-Control": "no-cache"})


def _bounded(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be in [{low}, {high}], got {value}", param=name)
    return value


def _node_dict(node: Any, tokenizer: Any | None) -> dict[str, Any]:
    out = {"id": node.node_id, "parent": node.parent_id, "prefix_len": node.prefix_len,
           "tokens": node.num_tokens, "hits": node.hits, "locked": node.locked,
           "evictable": node.evictable, "children": node.num_children, "tier": node.tier,
           "last_access": node.last_access, "ids": list(node.token_ids[:IDS_PER_NODE])}
    if tokenizer is not None and node.token_ids:
        out["text"] = tokenizer.decode(list(node.token_ids))
    return out


def tree_json(state: ServerState, max_nodes: int, max_bytes: int, show_text: bool) -> bytes:
    """The `/radix_tree` body: the engine's TreeView plus the cache hit rate, cut to
    `max_bytes` (whole nodes, parents before children, so what is kept is a tree)."""
    engine = state.engine
    try:
        view = engine.radix_tree_view(max_nodes, TEXT_TOKENS if show_text else IDS_PER_NODE)
    except queue.Empty:
        raise ApiError(503, "the scheduler did not answer in time; try again") from None
    stats = engine.get_stats()
    head = {"enabled": view.enabled, "num_nodes": view.num_nodes,
            "total_tokens": view.total_tokens, "evictable_tokens": view.evictable_tokens,
            "protected_tokens": view.protected_tokens, "host_tokens": view.host_tokens,
            "cache_hit_rate": stats.get("cache_hit_rate"),
            "cached_tokens_total": stats.get("cached_tokens_total"),
            "prompt_tokens_total": stats.get("prompt_tokens_total"),
            "show_text": show_text, "max_nodes": max_nodes, "max_bytes": max_bytes}
    tokenizer = engine.tokenizer if show_text else None
    # the frame around the nodes with room for the flags set at the end
    size = len(json.dumps({**head, "truncated": False, "truncated_by": "max_nodes",
                           "returned": max_nodes, "nodes": []}))
    nodes: list[str] = []
    by = "max_nodes" if view.truncated else None
    for node in view.nodes:
        text = json.dumps(_node_dict(node, tokenizer), ensure_ascii=False)
        cost = len(text.encode()) + (1 if nodes else 0)
        if size + cost > max_bytes:
            by = "max_bytes"
            break
        nodes.append(text)
        size += cost
    head.update(truncated=by is not None, truncated_by=by, returned=len(nodes))
    frame = json.dumps({**head, "nodes": None}, ensure_ascii=False)
    assert frame.endswith("null}")
    return (frame[:-5] + "[" + ",".join(nodes) + "]}").encode()


@router.get("/radix_tree")
async def radix_tree(request: Request, max_nodes: int = DEFAULT_NODES,
                     max_bytes: int | None = None) -> Response:
    """The prefix cache as a bounded tree (see the module docstring)."""
    state = get_state(request)
    if not hasattr(state.engine, "radix_tree_view"):
        raise ApiError(501, "this engine has no radix tree view")
    cap = state.settings.radix_tree_max_bytes
    max_nodes = _bounded("max_nodes", max_nodes, 1, MAX_NODES)
    max_bytes = _bounded("max_bytes", cap if max_bytes is None else max_bytes, 1024, cap)
    client = request.client.host if request.client else None
    show_text = state.settings.playground_show_text and is_loopback(client)
    body = await asyncio.to_thread(tree_json, state, max_nodes, max_bytes, show_text)
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})
