"""Identical subschemas built once: the last of ``prepare_schema``'s rewrites (``share_repeats``).

llguidance's JSON compiler builds a subschema where it stands, every time it stands there,
and a ``$ref`` target once. Generated schemas repeat themselves: o26621 of JSONSchemaBench
spells ``{"type": "string", "format": "uri"}`` 32 times, and each copy builds the URI lexeme
again (~1.2 ms apiece on a 2-core Xeon; the 32 built as one ``$ref`` target take 2 ms in all);
``dependencies`` rewrites copy whole object schemas. So a subschema that occurs twice or more
(compared without annotations, which assert nothing) moves to the root's ``$defs`` under a
new name, and each place it stood becomes a ``$ref`` to it. Exact: a subschema means the same
wherever it stands, given that its local ``$ref``s name the same document root.

Left as they are: a document with a resource or anchor keyword below its root (``$id``, draft
4's ``id``, ``$anchor``, dynamic or recursive references: a reference inside would resolve
against another base) or a ``$ref`` that is not a local JSON pointer (nothing is shared); a
subschema some ``$ref`` points at or through (the pointer must still find it); a bare
``$ref``; and what sits below ``allOf`` and ``oneOf`` (llguidance intersects the members of
one and proves the branches of the other disjoint by reading them in place: a ``const``
behind a reference is one it cannot see) and below the keywords llguidance reads other than
as a subschema to build (``not``, ``if``, ``propertyNames``, ``contains``, ...): not walked.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constraints.schema.analysis import (
    ANNOTATIONS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_ONE,
    pointer_target,
)

# where the walk goes: analysis's subschema positions but those llguidance reads in place
# or not as a subschema to build ("items": one or a list)
_IN_PLACE = frozenset(("allOf", "oneOf", "not", "if", "then", "else", "contains",
                       "propertyNames", "dependentSchemas", "unevaluatedItems",
                       "unevaluatedProperties"))
_KIND = {**{k: "map" for k in SCHEMA_MAPS if k not in _IN_PLACE},
         **{k: "list" for k in SCHEMA_LISTS if k not in _IN_PLACE},
         **{k: "one" for k in SCHEMA_ONE if k not in _IN_PLACE},
         "items": "items", "$ref": "ref", **dict.fromkeys(ANNOTATIONS, "skip")}
_SCOPES = frozenset(("$id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveRef",
                     "$recursiveAnchor"))
_NAME = "radixlm-shared-"


class _Unshareable(Exception):
    """The document's references may not resolve against its root: share nothing."""


def share_repeats(schema: Any) -> Any:
    """``schema`` (a prepared document root) with every subschema that occurs twice or more
    moved to ``$defs`` and referenced (see the module docstring); ``schema`` itself when
    nothing repeats or the document is one the module leaves alone. Never mutates ``schema``."""
    if not isinstance(schema, dict) or not isinstance(schema.get("$defs", {}), dict):
        return schema
    walk = _Walk()
    try:
        walk.key(schema, top=True)
        pinned = walk.pinned(schema)
    except _Unshareable:
        return schema
    repeated = {k for k, n in walk.count.items() if n >= 2}
    if not repeated:
        return schema
    return _Rewrite(walk.key_of, repeated, pinned, schema.get("$defs", {})).document(schema)


class _Walk:
    """One pass over the document: an interned key per subschema (its keywords without
    annotations, subschemas by their keys), how often each key occurs below the root, and
    the ``$ref``s met."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self.key_of: dict[int, int] = {}  # id(subschema) -> its key
        self.count: dict[int, int] = {}
        self.refs: set[str] = set()

    def key(self, node: dict, top: bool = False) -> int:
        if not top and (not _SCOPES.isdisjoint(node) or type(node.get("id")) is str) \
                or top and not _SCOPES.isdisjoint(node.keys() - {"$id"}):
            raise _Unshareable  # (the root's own base URI changes nothing for "#/..." pointers)
        parts: list = []  # keyword, value, keyword, value, ...
        for k, v in node.items():
            kind = _KIND.get(k)
            if kind is None:
                parts += (k, v if type(v) is str else _value(v))
            elif kind == "skip":
                continue
            elif kind == "ref" and type(v) is str:
                self.refs.add(v)
                parts += (k, v)
            elif kind == "map" and type(v) is dict:
                parts += (k, tuple([x for m, s in v.items()
                                    for x in (m, self.key(s) if type(s) is dict else _value(s))]))
            elif (kind == "list" or kind == "items") and type(v) is list:
                parts += (k, tuple([self.key(s) if type(s) is dict else _value(s) for s in v]))
            elif (kind == "one" or kind == "items") and type(v) is dict:
                parts += (k, self.key(v))
            elif kind == "ref":
                raise _Unshareable
            else:
                parts += (k, _value(v))
        key = self.ids.setdefault(tuple(parts), len(self.ids))
        self.key_of[id(node)] = key
        if not top and (len(parts) > 2 or parts and parts[0] != "$ref"):  # (not {}, a bare $ref)
            self.count[key] = self.count.get(key, 0) + 1
        return key

    def pinned(self, root: dict) -> set[int]:
        """``id`` of every node a ``$ref`` points at or through (the pointer must still find
        it; each found as ``analysis.pointer_target`` finds it). ``_Unshareable`` for a
        reference that is not a local JSON pointer."""
        out = {id(root)}
        for ref in self.refs:
            if ref != "#" and not ref.startswith("#/"):
                raise _Unshareable
            steps = ref.split("/")
            for n in range(2, len(steps) + 1):
                try:
                    out.add(id(pointer_target(root, "/".join(steps[:n]))))
                except KeyError:  # (a dangling pointer: llguidance's error either way)
                    break
        return out


class _Rewrite:
    """The document again, each repeated subschema a ``$ref`` to its one copy in ``$defs``."""

    def __init__(self, key_of: dict[int, int], repeated: set[int], pinned: set[int],
                 defs: dict) -> None:
        self.key_of, self.repeated, self.pinned = key_of, repeated, pinned
        self.defs = dict(defs)
        self.names: dict[int, str] = {}

    def document(self, root: dict) -> dict:
        out = self.node(root)
        out["$defs"] = {**out.get("$defs", {}), **{n: self.defs[n] for n in self.names.values()}}
        return out

    def node(self, node: dict) -> dict:
        """``node`` with its subschemas rewritten."""
        out = dict(node)
        for k, v in node.items():
            kind = _KIND.get(k)
            if kind == "map" and type(v) is dict:
                out[k] = {m: self.sub(s) for m, s in v.items()}
            elif (kind == "list" or kind == "items") and type(v) is list:
                out[k] = [self.sub(s) for s in v]
            elif (kind == "one" or kind == "items") and type(v) is dict:
                out[k] = self.sub(v)
        return out

    def sub(self, node: Any) -> Any:
        if type(node) is not dict:
            return node
        key = self.key_of[id(node)]
        if key in self.repeated and id(node) not in self.pinned:
            return {"$ref": f"#/$defs/{self._name(key, node)}"}
        return self.node(node)

    def _name(self, key: int, node: dict) -> str:
        if key not in self.names:
            name = f"{_NAME}{len(self.names)}"
            while name in self.defs:
                name += "_"
            self.names[key] = name
            self.defs[name] = self.node(node)
        return self.names[key]


def _value(v: Any) -> tuple:
    """A keyword's value other than a string (which stands for itself) as a hashable key
    part: never equal to a string, a subschema's key (an int) or another type's value."""
    t = type(v)
    if t is int or t is float:
        return (1, repr(v))
    if t is list and all(type(x) is str for x in v):  # (required, enum: json.dumps's ~3 µs)
        return (2, *v)
    return (0, json.dumps(v, sort_keys=True))
