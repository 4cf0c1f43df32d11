"""``oneOf`` for llguidance, which implements ``anyOf`` but not ``oneOf``: branches rewritten
so that no two can match one value (``analysis.disjoint`` proves it), then used as
``anyOf``. Exact unless a docstring says *subset*."""

from __future__ import annotations

from typing import Any

from radixlm.constraints.schema.analysis import (
    ANNOTATIONS,
    DOCUMENT_KEYS,
    NUMERIC_KEYWORDS,
    OBJECT_BASIC_KW,
    TYPE_KEYWORDS,
    all_disjoint,
    canon,
    follow_ref,
    type_names,
    value_set,
)

_OBJECT_KEYWORDS = frozenset(OBJECT_BASIC_KW)


def one_of_as_any_of(branches: list, root: Any) -> list | None:
    """``oneOf`` branches rewritten so that no two can match one value, for use as ``anyOf``;
    None when that can't be shown. A branch of object keywords only (no ``type``) also
    matches every non-object, so with two such branches no non-object is valid: those
    branches get ``type: object`` (exact then; with one such branch, a sound subset).
    Branches that only list ``required`` keys are made exclusive (see ``_exclusive``)."""
    typed = [_typed_object(b, root) for b in branches]
    if all_disjoint(typed, root):
        return typed
    split = _split_overlaps(typed, root) if len(typed) <= 64 else None
    if split is not None and all_disjoint(split, root):
        return split
    return _exclusive(branches)


def _split_overlaps(branches: list, root: Any) -> list | None:
    """Values valid under two ``oneOf`` branches are invalid, so where two branches overlap
    in a way that can be cut exactly, cut the overlap from both (a branch left empty is
    dropped): two enum/const branches lose their common values; a branch that is only a
    ``type`` and another whose other keywords don't apply to some shared type (so every
    value of that type matches both) both lose that type. None when nothing applies."""
    out = []
    for b in branches:
        r = follow_ref(b, root)
        if not isinstance(r, dict) or "$id" in r or "id" in r:
            out.append(b)
            continue
        out.append({k: v for k, v in r.items() if k not in DOCUMENT_KEYS})
    changed = False
    for i in range(len(out)):
        for j in range(len(out)):
            a, b = out[i], out[j]
            if i == j or not isinstance(a, dict) or not isinstance(b, dict):
                continue
            if _pure(a, {"enum", "const"}) and _pure(b, {"enum", "const"}) and i < j:
                common = {canon(v) for v in value_set(a)} & {canon(v) for v in value_set(b)}
                if common:
                    for k in (i, j):
                        x = out[k]
                        keep = [v for v in value_set(x) if canon(v) not in common]
                        out[k] = {**{q: w for q, w in x.items() if q not in ("enum", "const")},
                                  "enum": keep}
                    changed = True
            elif _pure(b, set()) and "type" in a:
                shared = _type_list(a) & _type_list(b) - {"integer", "number"}
                rest = set(a) - ANNOTATIONS - {"type"}
                cut = {t for t in shared if not rest & TYPE_KEYWORDS.get(t, set())}
                if cut and not rest - set().union(*TYPE_KEYWORDS.values()) - NUMERIC_KEYWORDS:
                    out[i] = {**a, "type": [t for t in _type_list(a) if t not in cut]}
                    out[j] = {**b, "type": [t for t in _type_list(b) if t not in cut]}
                    changed = True
    if not changed:
        return None
    return [x for x in out if not (isinstance(x, dict) and
                                   (x.get("type") == [] or x.get("enum") == []))]


def _pure(s: dict, allowed: set[str]) -> bool:
    """``s`` asserts only ``type`` plus the ``allowed`` keywords (at least one of them when
    ``allowed`` is not empty)."""
    keys = set(s) - ANNOTATIONS
    if allowed:
        return bool(keys & allowed) and keys <= allowed | {"type"} and value_set(s) is not None
    return keys == {"type"}


def _type_list(s: dict) -> set[str]:
    t = s.get("type")
    return set(type_names(t)) if isinstance(t, (str, list)) else set()


def _typed_object(b: Any, root: Any) -> Any:
    r = follow_ref(b, root)
    if not isinstance(r, dict) or "type" in r or "$ref" in r or "$id" in r or "id" in r:
        return b
    keys = set(r) - ANNOTATIONS - set(DOCUMENT_KEYS)
    if not keys or not keys <= _OBJECT_KEYWORDS:
        return b
    return {**{k: v for k, v in r.items() if k not in DOCUMENT_KEYS}, "type": "object"}


def _exclusive(branches: list) -> list | None:
    """``oneOf: [{"required": R1}, {"required": R2}, ...]``: branch i keeps R_i and forbids
    one key of each other R_j it lacks (exact when every R_j has one key; a sound subset
    otherwise); a branch whose keys include all of another's can never be the only match
    and is dropped. Non-objects match every branch, so none is valid: ``type: object``."""
    reqs = []
    for b in branches:
        if not isinstance(b, dict) or set(b) - ANNOTATIONS != {"required"} \
                or not isinstance(b["required"], list) or not b["required"]:
            return None
        reqs.append(b["required"])
    if len(reqs) < 2:
        return None
    out = []
    for i, ri in enumerate(reqs):
        forbid = [next((k for k in rj if k not in ri), None) for j, rj in enumerate(reqs)
                  if j != i]
        if None in forbid:
            continue
        out.append({"type": "object", "required": list(ri),
                    "properties": dict.fromkeys(forbid, False)})
    return out or None
