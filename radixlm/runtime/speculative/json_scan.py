"""Where a JSON document being generated stands: inside which value, under which key.

``JsonScan`` reads the text of a request's output a character at a time (incrementally: a
call feeds only what was appended) and keeps the container stack, the key each object member
is under, and the string or number literal in progress. ``context()`` answers the drafter's
question "what is being written now": a string value (with its text so far), a value about
to start, or a number in progress, with the key path leading to it. ``schema_node`` walks a
JSON schema along that path (``properties`` / ``items``, local ``$ref``s) for the value's
type and whether its key is the object's last one. Plain Python, forgiving: text that is not
JSON (a reasoning preamble, a broken document) only leaves the scan without a context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

STRING, START, NUMBER = "string", "start", "number"


@dataclass(frozen=True)
class ValueContext:
    """``kind``: STRING (inside a string value; ``partial`` is its text so far), START (a
    value may begin here: after ``:`` or inside an array) or NUMBER (``partial``: its
    digits so far). ``path``: the keys from the document's root (``"[]"`` for an array's
    item); ``in_array``: the value is an array item; ``start``: where in the scanned text
    the value's characters begin (START: the text's end), which tells two values apart."""

    kind: str
    path: tuple[str, ...]
    partial: str = ""
    in_array: bool = False
    start: int = 0

    @property
    def key(self) -> str:
        """The innermost key (an array item: the array's key), "" at the root."""
        for part in reversed(self.path):
            if part != "[]":
                return part
        return ""


class JsonScan:
    """An incremental scanner of one JSON document's text (see the module docstring)."""

    __slots__ = ("text", "stack", "in_str", "is_key", "esc", "buf", "lit", "broken", "pos",
                 "value_at")

    def __init__(self) -> None:
        self.text = ""
        self.stack: list[list] = []  # [open char, key or None, expecting]
        self.in_str = self.is_key = self.esc = self.broken = False
        self.buf: list[str] = []
        self.lit = ""
        self.pos = self.value_at = 0  # characters fed; where the value in progress began

    def update(self, text: str) -> None:
        """Bring the scan to ``text`` (the whole output so far): fed the appended part, or
        rescanned from the start where ``text`` does not extend what was scanned."""
        if not text.startswith(self.text):
            self.__init__()
        for c in text[len(self.text):]:
            if not self.broken:
                self._feed(c)
            self.pos += 1
        self.text = text

    def _feed(self, c: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
                self.buf.append(c)
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                if self.stack:
                    top = self.stack[-1]
                    if self.is_key:
                        top[1], top[2] = "".join(self.buf), "colon"
                    else:
                        top[2] = "comma"
            else:
                self.buf.append(c)
            return
        if self.lit and (c.isspace() or c in ",}]"):
            self.lit = ""
            if self.stack:
                self.stack[-1][2] = "comma"
        if c.isspace():
            return
        top = self.stack[-1] if self.stack else None
        if c in "{[":
            self.stack.append([c, None, "key" if c == "{" else "value"])
        elif c in "}]":
            if not self.stack:
                self.broken = True
                return
            self.stack.pop()
            if self.stack:
                self.stack[-1][2] = "comma"
        elif c == ":" and top is not None:
            top[2] = "value"
        elif c == "," and top is not None:
            top[2] = "key" if top[0] == "{" else "value"
        elif c == '"':
            self.in_str, self.buf, self.value_at = True, [], self.pos + 1
            self.is_key = top is not None and top[0] == "{" and top[2] == "key"
        elif top is not None and top[2] in ("value", "literal"):
            if not self.lit:
                self.value_at = self.pos
            top[2], self.lit = "literal", self.lit + c
        else:
            self.broken = not self.stack and bool(self.text.strip())

    def context(self) -> ValueContext | None:
        """What is being written at the end of the scanned text (None: a key, punctuation,
        or no document)."""
        if self.broken or not self.stack:
            return None
        path = tuple("[]" if f[0] == "[" else (f[1] or "") for f in self.stack)
        top = self.stack[-1]
        in_array = top[0] == "["
        if self.in_str:
            return None if self.is_key else ValueContext(STRING, path, "".join(self.buf),
                                                         in_array, self.value_at)
        if self.lit:
            return ValueContext(NUMBER, path, self.lit, in_array, self.value_at)
        if top[2] == "value":
            return ValueContext(START, path, "", in_array, self.pos)
        return None


def load_schema(value: Any) -> dict | None:
    """A request's ``json_schema`` (text or dict) as a dict; None if it is neither."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            loaded = json.loads(value)
        except ValueError:
            return None
        return loaded if isinstance(loaded, dict) else None
    return None


def _resolve(root: dict, node: Any) -> dict:
    for _ in range(8):  # local $refs only, a few hops
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            break
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        node = target
    return node if isinstance(node, dict) else {}


def schema_node(root: dict | None, path: tuple[str, ...]) -> tuple[dict, bool]:
    """The schema of the value at ``path`` ({} where unknown) and whether its key is the
    last property of its object (its value closes the object)."""
    if root is None:
        return {}, False
    node, last = _resolve(root, root), False
    for part in path:
        if part == "[]":
            node, last = _resolve(root, node.get("items", {})), False
            continue
        props = node.get("properties")
        if not isinstance(props, dict) or part not in props:
            return {}, False
        last = list(props)[-1] == part
        node = _resolve(root, props[part])
    return node, last
