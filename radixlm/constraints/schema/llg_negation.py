"""``not`` for llguidance, which does not implement it: the forms of ``not: S`` that have a
rewrite into keywords it does implement, as assertions to add to the schema beside the
``not`` (see ``negate``), and the parsing of regex character classes these need.
Exact unless a docstring says *subset*."""

from __future__ import annotations

import re
from typing import Any

from radixlm.constraints.schema.analysis import (
    ALL_TYPES,
    ANNOTATIONS,
    ANY_VALUE,
    follow_ref,
    json_types,
    value_set,
)

MAX_NEGATED_ENUM_CHARS = 4096
# What Python's re (the validators' engine) matches with \s in a str pattern (the code
# points whose str.isspace() is true; a test checks the list).
_PY_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
             *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]


def negate(sub: Any, own: dict, root: Any) -> dict | bool | None:
    """``not: sub`` inside the schema ``own`` as assertions to add to ``own`` (a dict), False
    when nothing is left, or None when the form is not one we can rewrite (see module doc)."""
    if sub in ANY_VALUE:
        return False
    sub = follow_ref(sub, root)
    if not isinstance(sub, dict):
        return None
    keys = set(sub) - ANNOTATIONS
    own_types = json_types({"type": own["type"]}, root) if "type" in own else None
    if keys == {"type"}:
        return _negate_type(sub["type"], own.get("type"))
    if keys == {"required"} or keys == {"required", "properties"}:
        req, props = sub["required"], sub.get("properties", {})
        if isinstance(req, list) and len(req) == 1 and isinstance(props, dict) \
                and all(v in ANY_VALUE for v in props.values()):
            return {"properties": {req[0]: False}}
        return None
    if keys == {"properties"} and isinstance(sub["properties"], dict) \
            and len(sub["properties"]) == 1:
        # not {properties: {k: S}}: an object that has k, with a value S rejects
        if own_types is not None and "object" not in own_types:
            return False
        (name, prop), = sub["properties"].items()
        return {"type": "object", "required": [name], "properties": {name: {"not": prop}}}
    values = value_set(sub)
    if own_types is None and keys - {"type"} in ({"enum"}, {"const"}) and values \
            and all(isinstance(v, str) for v in values) \
            and sum(map(len, values)) <= MAX_NEGATED_ENUM_CHARS:
        # any type: a non-string, or a string not listed
        return {"anyOf": [{"type": [t for t in ALL_TYPES if t != "string"]},
                          {"type": "string", "pattern": "^(?:" + _none_of(sorted(set(values)))
                           + ")$"}]}
    if own_types != {"string"}:
        return None  # the forms below are rewritten for string schemas only
    sub_types = json_types({"type": sub["type"]}, root) if "type" in sub else None
    if sub_types is not None and "string" not in sub_types:
        return {}  # sub matches no string: "not sub" holds for every string
    if keys - {"type"} in ({"enum"}, {"const"}):
        words = sorted({v for v in value_set(sub) or [] if isinstance(v, str)})
        if sum(map(len, words)) > MAX_NEGATED_ENUM_CHARS:
            return None
        return {"pattern": "^(?:" + _none_of(words) + ")$"} if words else {}
    if keys - {"type"} == {"pattern"}:
        return _negate_class_pattern(sub["pattern"])
    return None


def _negate_type(banned_type: Any, own_type: Any) -> dict | bool:
    """``not {"type": T}``: the other types (``integer`` excluded with ``number``; ``number``
    dropped with ``integer``, whose complement JSON Schema can't spell: a subset)."""
    banned = {banned_type} if isinstance(banned_type, str) else set(banned_type)
    if banned & {"number", "integer"}:
        banned |= {"number", "integer"}
    allowed = [t for t in ALL_TYPES if t not in banned]
    if own_type is not None:
        own = {own_type} if isinstance(own_type, str) else set(own_type)
        allowed = [t for t in allowed if t in own or (t == "integer" and "number" in own)]
    return {"type": allowed} if allowed else False


def _rx(cp: int) -> str:
    ch = chr(cp)
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{cp:X}}}"


def _none_of(words: list[str]) -> str:
    """A regex (llguidance syntax, whole-string) for every string not in ``words``: walk the
    trie of the words; leave it by a character no word continues with, or stop at a node
    where no word ends."""
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def alts(node: dict) -> str:
        kids = sorted(k for k in node if k)
        out = [_rx(ord(k)) + "(?:" + alts(node[k]) + ")" for k in kids]
        out.append(("[^" + "".join(_rx(ord(k)) for k in kids) + "]" if kids else "[\\s\\S]")
                   + "[\\s\\S]*")
        if "" not in node:
            out.append("")
        return "|".join(out)

    return alts(trie)


_CLASS_PATTERN = re.compile(r"\^\[([^\^].*)\]([+*])\$")


def _negate_class_pattern(pattern: Any) -> dict | None:
    """``not {"pattern": "^[S]+$"}`` (or ``*``) on strings. Python's ``$`` also matches before
    a final newline, so the exact complement is awkward; the subset kept: the string holds a
    character outside S that is not a newline (plus the empty string for ``+``)."""
    m = _CLASS_PATTERN.fullmatch(pattern) if isinstance(pattern, str) else None
    cps = _class_code_points(m.group(1)) if m else None
    if cps is None:
        return None
    cps.add(ord("\n"))
    body = "[^" + "".join(_rx(c) for c in sorted(cps)) + "]"
    return {"pattern": f"^$|{body}" if m.group(2) == "+" else body}


def _class_code_points(body: str) -> set[int] | None:
    """The code points a Python regex class body (without brackets) matches, or None for a
    body with escapes other than ``\\s``, ``\\t\\n\\r\\f\\v`` and escaped punctuation."""
    singles: list[int | None] = []  # None marks a class escape such as \s
    cps: set[int] = set()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            if i + 1 >= len(body):
                return None
            e = body[i + 1]
            i += 2
            if e == "s":
                cps.update(_PY_SPACE)
                singles.append(None)
            elif e in "tnrfv":
                singles.append(ord({"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v"}[e]))
            elif not e.isalnum():
                singles.append(ord(e))
            else:
                return None
            continue
        if ch in "[]":
            return None
        singles.append(ord(ch))
        i += 1
    j = 0
    while j < len(singles):  # ranges: a '-' between two single characters
        c = singles[j]
        if (j + 2 < len(singles) and singles[j + 1] == ord("-") and c is not None
                and singles[j + 2] is not None and not _escaped_dash(body, j + 1)):
            if c > singles[j + 2]:
                return None
            cps.update(range(c, singles[j + 2] + 1))
            j += 3
            continue
        if c is not None:
            cps.add(c)
        j += 1
    return cps


def _escaped_dash(body: str, index: int) -> bool:
    """Whether the ``index``-th class element of ``body`` is ``\\-`` (a literal dash)."""
    k = n = 0
    while k < len(body):
        step = 2 if body[k] == "\\" else 1
        if n == index:
            return body[k] == "\\"
        k, n = k + step, n + 1
    return False
