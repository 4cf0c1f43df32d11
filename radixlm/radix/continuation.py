"""What the cached sequences say comes after a token sequence: the radix tree's continuation
query (``RadixCache.continuation``) and the cursor that keeps repeated queries on one growing
sequence proportional to the tokens added since the last query.

Read-only: a query never splits a node, touches access times or hit counts, or takes a lock,
so asking it cannot change what is evicted. Pure Python, no torch.
"""

from __future__ import annotations

from typing import Any


class ContinuationCursor:
    """Where the last ``continuation`` query on one growing sequence stopped.

    A caller keeps one cursor per sequence and passes it with every query of that sequence.
    Contract: between two queries with the same cursor the sequence only grows by appending
    (call ``reset`` after a rollback, or use a new cursor for another sequence). A cursor
    whose nodes were evicted, dropped by the cache's ``reset``, or that was used with another
    cache falls back to a walk from the root by itself.

    Fields (the tree's own; callers only ``reset``): ``node`` is the deepest tree node whose
    whole root path equals ``tokens[:depth]`` at the last query. ``edge`` is set where the
    last query stopped inside an edge: ``(edge node, the edge's end depth, depth, diverged)``:
    the sequence matched the path down to ``depth`` inside that edge, and then either ended
    (``diverged`` False) or differed in the page starting at ``depth`` (True). Splits keep
    these valid: the node object of a split edge keeps the lower part and its end depth, so
    its root path spells the same tokens, and the edge's start depth (end depth minus its
    length) tells where it begins.
    """

    __slots__ = ("owner", "node", "depth", "edge")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.owner: Any = None
        self.node: Any = None
        self.depth = 0
        self.edge: tuple[Any, int, int, bool] | None = None

    def __repr__(self) -> str:
        return f"ContinuationCursor(depth={self.depth}, edge={self.edge is not None})"


def _child_for(node: Any, tokens: list[int], pos: int, page: int) -> Any:
    """The child of ``node`` whose edge starts with ``tokens[pos:]`` (its first page), or
    None. A partial last page picks the most recently used child that begins with it."""
    if page == 1:
        return node.children.get(tokens[pos])
    if len(tokens) - pos >= page:
        return node.children.get(tuple(tokens[pos : pos + page]))
    head = tokens[pos:]
    fits = [c for c in node.children.values() if c.key[: len(head)] == head]
    return max(fits, key=_recency) if fits else None


def _recency(node: Any) -> tuple[int, int]:
    return node.last_access, node.node_id


_STUCK = (None, 0, None, 0, 0)


def _resume(cache: Any, cursor: ContinuationCursor | None,
            n: int) -> tuple[Any, int, Any, int, int]:
    """Start of the walk: ``(node, its depth, edge, edge start depth, matched length)``, from
    the cursor's place if still valid, else the root (``edge`` None: matched == depth).
    ``_STUCK``: the sequence is known to leave the tree inside an edge that nothing has
    split at the divergence since (a new branch there needs that split)."""
    root = cache._root
    if cursor is None:
        return root, 0, None, 0, 0
    node = cursor.node
    if cursor.owner is not cache or node is None or node.dead or cursor.depth > n:
        cursor.reset()
        return root, 0, None, 0, 0
    if cursor.edge is not None:
        edge, end, depth, diverged = cursor.edge
        start = end - len(edge.key)
        if not edge.dead and depth <= n:
            if diverged and start < depth:
                return _STUCK
            # a sibling can only appear at a node boundary: the page holding ``depth``
            # must lie inside the edge, past its first page, to resume there
            if not diverged and cursor.depth <= start < depth - depth % cache.page_size:
                return node, cursor.depth, edge, start, depth
        cursor.edge = None
    return node, cursor.depth, None, 0, cursor.depth


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def continuation(cache: Any, tokens: list[int], max_len: int,
                 cursor: ContinuationCursor | None = None) -> list[int]:
    """Up to ``max_len`` tokens that follow ``tokens`` in the tree, or [] when no cached
    sequence has all of ``tokens`` as a proper prefix. Where sequences branch after the
    match, the most recently used branch is followed (the latest run of an agent or a
    template). See ``RadixCache.continuation`` for the contract."""
    if max_len <= 0:
        return []
    n = len(tokens)
    node, depth, edge, start, pos = _resume(cache, cursor, n)
    if node is None:
        return []
    out: list[int] = []
    while pos < n or edge is not None:
        if edge is None:
            edge, start = _child_for(node, tokens, pos, cache.page_size), pos
            if edge is None:
                _remember(cursor, cache, node, depth, None)
                return []
        key, off = edge.key, pos - start
        hi = min(len(key) - off, n - pos)
        mine, theirs = tokens[pos : pos + hi], key[off : off + hi]
        if mine != theirs:  # the sequence leaves the tree inside this edge
            # a sibling that continues the sequence can appear without splitting this edge
            # at the start of the page holding the first difference (edges are whole pages)
            differ = pos + _first_difference(mine, theirs)
            differ -= differ % cache.page_size
            _remember(cursor, cache, node, depth, (edge, start + len(key), differ, True))
            return []
        pos += hi
        if pos < start + len(key):  # the sequence ends inside this edge
            _remember(cursor, cache, node, depth, (edge, start + len(key), pos, False))
            out, node = key[pos - start : pos - start + max_len], edge
            break
        node, depth, edge = edge, pos, None
    else:
        _remember(cursor, cache, node, depth, None)
    while len(out) < max_len and node.children:
        node = max(node.children.values(), key=_recency)
        out += node.key[: max_len - len(out)]
    return out


def _remember(cursor: ContinuationCursor | None, cache: Any, node: Any, depth: int,
              edge: tuple[Any, int, int, bool] | None) -> None:
    if cursor is not None:
        cursor.owner, cursor.node, cursor.depth, cursor.edge = cache, node, depth, edge
