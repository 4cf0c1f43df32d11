"""JSON Schema -> the schema given to llguidance's JSON compiler (``prepare_schema``).

llguidance enforces a fixed keyword set (``lenient: false`` makes anything else an error naming
it). Some of the keywords it refuses have exact rewrites into keywords it implements; those
are made here, and everything else is left for the compiler to refuse (the backend then tries
the regex translator, which refuses by name in turn). Nothing is dropped unless it asserts
nothing. The rewrites, each exact unless marked *subset* (a sound restriction: every value
generated is valid, some valid values are never generated):

- ``oneOf`` whose branches are provably disjoint (JSON types, finite value sets, a required
  discriminating property, a ``not`` of the other branch, anchored pattern prefixes, every
  nested ``anyOf``/``oneOf`` branch disjoint) -> ``anyOf``; branches of object keywords only
  get ``type: object``; branches that only list ``required`` keys are made exclusive;
  overlaps that can be cut exactly are cut from both branches (values two branches accept
  are invalid): common values of two enums, a type shared with a bare ``{"type": ...}``
  branch when the other branch's keywords don't constrain that type.
- ``not``: ``{}`` (nothing), ``{"type": ...}`` (the other types), ``{"required": [k]}``
  (``properties: {k: false}``), ``{"properties": {k: S}}`` (an object with k, whose value is
  ``not S``), ``{"enum"/"const": strings}`` (a pattern for "none of these strings", for
  strings; other types pass), ``{"pattern": "^[S]+$"}`` / ``"^[S]*$"`` on a string schema
  (*subset*: the string holds a character outside S and not a newline); local ``$ref``
  targets of those shapes likewise.
- ``dependencies`` / ``dependentRequired`` / ``dependentSchemas`` -> an ``anyOf`` of copies
  of the object schema: without the trigger property, or with the dependency merged in.
- ``uniqueItems: true`` -> ``maxItems: 1`` (*subset*), as in the regex translator.
- ``format``: ``uri-reference``/``iri``/``iri-reference``/``url`` -> ``uri``, ``idn-email`` ->
  ``email``, ``idn-hostname``/``host-name`` -> ``hostname``, ``ip-address`` -> ``ipv4``
  (*subsets*); ``color``, ``json-pointer``, ``regex`` -> the translator's pattern for them
  (*subset*); a name no draft defines is an annotation and is dropped.
- objects that list ``properties`` are closed (``additionalProperties: false``, *subset*),
  xgrammar's strict mode in SGLang; left open: ``allOf`` members (and definitions some
  ``allOf`` refers to), ``anyOf``/``oneOf`` branches of those or beside an ``allOf``, and
  objects with ``allOf`` / ``$ref`` beside their properties (closing those could empty the
  language).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from radixlm.constraints import regex_parts as rp
from radixlm.constraints.schema import ALL_TYPES, KNOWN_FORMATS, pointer_target

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_ONE = ("additionalProperties", "additionalItems", "not", "if", "then", "else",
              "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
ANNOTATIONS = frozenset(("title", "description", "$comment", "examples", "default"))
# Formats llguidance 1.9 implements; others are rewritten (FORMAT_ALIASES, pattern) or refused.
LLG_FORMATS = frozenset("date-time time date duration email hostname ipv4 ipv6 uuid uri".split())
FORMAT_ALIASES = {"uri-reference": "uri", "iri": "uri", "iri-reference": "uri", "url": "uri",
                  "idn-email": "email", "idn-hostname": "hostname", "host-name": "hostname",
                  "ip-address": "ipv4"}
FORMAT_PATTERNS = {f: "^" + rp.FORMATS[f][1:-1] + "$" for f in ("color", "json-pointer", "regex")}
MAX_NEGATED_ENUM_CHARS = 4096
MAX_DEPENDENCY_VARIANTS = 8
# Steps of oneOf disjointness proofs per schema: past it, oneOf is left for the compiler to
# refuse, so a hostile schema cannot hold the request thread in the prover.
MAX_PROOF_STEPS = 20_000
_proof = threading.local()
_DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
# Keys that place a schema in its document: stay on the node, never copied into branches.
_DOCUMENT_KEYS = ("$schema", "$id", "id", "$anchor", "$defs", "definitions")
# What Python's re (the validators' engine) matches with \s in a str pattern (the code
# points whose str.isspace() is true; a test checks the list).
_PY_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
             *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]


def prepare_schema(schema: Any, in_all_of: bool = False, root: Any = None) -> Any:
    """A copy of ``schema`` with the rewrites in the module docstring applied at every
    schema position. ``in_all_of``: the node is an ``allOf`` member (never closed)."""
    if not isinstance(schema, dict):
        return schema
    if root is None:
        root, _proof.steps = schema, MAX_PROOF_STEPS
    out = dict(schema)
    listed = isinstance(schema.get("properties"), dict)  # before "not" may add some
    if isinstance(out.get("oneOf"), list) and "anyOf" not in out:
        branches = one_of_as_any_of(out["oneOf"], root)
        if branches is not None:
            del out["oneOf"]
            out["anyOf"] = branches
    if _implied_type(out, root):
        del out["type"]  # a sibling of recursive $refs that llguidance would refuse
    if out.get("uniqueItems") is False:
        del out["uniqueItems"]
    elif out.get("uniqueItems") is True and out.get("minItems", 0) <= 1:
        del out["uniqueItems"]  # at most one item is always unique (a sound subset)
        out["maxItems"] = min(out.get("maxItems", 1), 1)
    if "not" in out and "$ref" not in out:
        negated = negate(out["not"], out, root)
        if negated is False:
            return False
        if negated is not None:
            del out["not"]
            _merge(out, negated)
    _rewrite_format(out)
    in_all_ofs = _all_of_targets(root) if schema is root else set()
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict) and key != "dependentSchemas":  # (see below)
            out[key] = {k: prepare_schema(v, f"#/{key}/{k}" in in_all_ofs, root)
                        for k, v in out[key].items()}
    # branches that get intersected with something (an allOf member's, or beside allOf)
    # stay open like allOf members
    intersected = in_all_of or "allOf" in out
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            open_ = key == "allOf" or (intersected and key in ("anyOf", "oneOf"))
            out[key] = [prepare_schema(v, open_, root) for v in out[key]]
    for key in SCHEMA_ONE:
        if key in out and key != "not":  # closing inside a "not" would widen its complement
            out[key] = prepare_schema(out[key], root=root)
    if isinstance(out.get("items"), list):
        out["items"] = [prepare_schema(v, root=root) for v in out["items"]]
    elif "items" in out:
        out["items"] = prepare_schema(out["items"], root=root)
    props = out.get("properties")
    required = out.get("required") if isinstance(out.get("required"), list) else []
    if (listed and isinstance(props, dict) and not in_all_of and all(r in props for r in required)
            and not any(k in out for k in ("additionalProperties", "patternProperties",
                                           "unevaluatedProperties", "allOf", "$ref"))):
        out["additionalProperties"] = False
    if any(k in out for k in _DEPENDENCY_KEYS):
        return _with_dependencies(out, root)
    return out


def _all_of_targets(root: Any) -> set[str]:
    """``$ref``s that are ``allOf`` members anywhere in the document: their targets are
    intersected with something, so they are left open like ``allOf`` members."""
    found: set[str] = set()
    stack = [root]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            members = x.get("allOf")
            if isinstance(members, list):
                found.update(m["$ref"] for m in members
                             if isinstance(m, dict) and isinstance(m.get("$ref"), str))
            stack.extend(v for v in x.values() if isinstance(v, (dict, list)))
        elif isinstance(x, list):
            stack.extend(v for v in x if isinstance(v, (dict, list)))
    return found


def _implied_type(out: dict, root: Any) -> bool:
    """``out`` is ``{"type": T, "anyOf": [...]}`` (plus annotations) and every branch can
    only match types in T, so ``type`` says nothing more."""
    if set(out) - ANNOTATIONS - set(_DOCUMENT_KEYS) != {"type", "anyOf"} \
            or not isinstance(out["anyOf"], list):
        return False
    own = json_types({"type": out["type"]}, root)
    return own is not None and all((json_types(b, root) or {"?"}) <= own
                                   for b in out["anyOf"])


def _merge(out: dict, extra: dict) -> None:
    """Add the assertions of ``extra`` to the schema ``out`` (a conjunction)."""
    for key, value in extra.items():
        if key == "type":
            out["type"] = value
        elif key == "properties":
            props = dict(out.get("properties", {}))
            for name, sub in value.items():
                old = props.get(name, True)
                props[name] = sub if sub is False or old in ({}, True) \
                    else {"allOf": [old, sub]}
            out["properties"] = props
        elif key == "required":
            out["required"] = list(dict.fromkeys(list(out.get("required", [])) + value))
        elif key == "pattern" and "pattern" not in out:
            out["pattern"] = value
        else:
            out["allOf"] = list(out.get("allOf", [])) + [{key: value}]


def _rewrite_format(out: dict) -> None:
    fmt = out.get("format")
    if not isinstance(fmt, str) or fmt in LLG_FORMATS:
        return
    if fmt in FORMAT_ALIASES:
        out["format"] = FORMAT_ALIASES[fmt]
    elif fmt in FORMAT_PATTERNS:
        del out["format"]
        _merge(out, {"pattern": FORMAT_PATTERNS[fmt]})
    elif fmt not in KNOWN_FORMATS:
        del out["format"]  # an unknown format is an annotation: it asserts nothing


def _with_dependencies(out: dict, root: Any) -> dict:
    """``out`` with ``dependencies`` (draft 4-7), ``dependentRequired`` and
    ``dependentSchemas`` (2019-09+) spelled as an ``anyOf`` of copies of ``out``: for each
    dependency one copy without its trigger property and one with the dependency merged in
    (a list extends ``required``; a schema's ``required``/``properties`` are merged into the
    copy). No ``allOf`` is used: llguidance refuses intersections near recursive ``$ref``s.
    Forms that do not merge are put back for the compiler to refuse."""
    deps = [(name, dep) for k in _DEPENDENCY_KEYS
            if isinstance(out.get(k), dict) for name, dep in out[k].items()
            if not (dep is True or dep == [] or dep == {})]
    base = {k: v for k, v in out.items() if k not in _DEPENDENCY_KEYS}
    variants = [base]
    for name, dep in deps:
        dep = dep if isinstance(dep, (list, bool)) else prepare_schema(dep, True, root)
        nxt = []
        for v in variants:
            nxt.append({**v, "properties": {**v.get("properties", {}), name: False}})
            merged = _merge_dependency(v, dep)
            if merged is None:
                return out
            if merged is not False:
                nxt.append(merged)
        variants = nxt
        if len(variants) > MAX_DEPENDENCY_VARIANTS:
            return out
    if len(variants) == 1:
        return variants[0]
    keep = {k: v for k, v in base.items() if k in ANNOTATIONS or k in _DOCUMENT_KEYS}
    return {**keep, "anyOf": [{k: v for k, v in x.items() if k not in _DOCUMENT_KEYS}
                              for x in variants]}


def _merge_dependency(v: dict, dep: Any) -> dict | bool | None:
    """The object schema ``v`` with a dependency's assertions merged in; False if it is
    unsatisfiable; None when it can't be merged here."""
    if dep is False:
        return False
    if isinstance(dep, list):
        return {**v, "required": list(dict.fromkeys(list(v.get("required", [])) + dep))}
    if not isinstance(dep, dict) or set(dep) - ANNOTATIONS - {"properties", "required"}:
        return None
    out = dict(v)
    props = dict(v.get("properties", {}))
    closed = v.get("additionalProperties") is False and "patternProperties" not in v
    for name, sub in dep.get("properties", {}).items():
        if name in props:
            props[name] = {"allOf": [props[name], sub]}
        elif not closed:
            return None  # the object's additionalProperties would also apply to it
    out["properties"] = props
    if dep.get("required"):
        out["required"] = list(dict.fromkeys(list(v.get("required", [])) + dep["required"]))
    return out


# ------------------------------------------------------------------------------ oneOf


def resolve(s: Any, root: Any, depth: int = 0) -> Any:
    """``s`` with a bare local ``$ref`` (only annotations beside it) followed; None when the
    reference is remote, missing, or has asserting siblings."""
    while isinstance(s, dict) and "$ref" in s:
        ref = s["$ref"]
        if depth > 8 or not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")) \
                or set(s) - ANNOTATIONS - {"$ref"}:
            return None
        try:
            s, depth = pointer_target(root, ref), depth + 1
        except KeyError:
            return None
    return s


def _type_of(v: Any) -> str:
    return {bool: "boolean", type(None): "null", str: "string", dict: "object",
            list: "array"}.get(type(v), "number")


def value_set(s: dict) -> list | None:
    if "const" in s:
        return [s["const"]]
    return s["enum"] if isinstance(s.get("enum"), list) else None


def json_types(s: Any, root: Any) -> set[str] | None:
    """The JSON types a subschema can match, from ``type``/``const``/``enum`` (following
    local ``$ref``s); None when it can't be told. ``number`` includes ``integer``."""
    s = resolve(s, root)
    if not isinstance(s, dict):
        return None
    values = value_set(s)
    if values is not None:
        found = {_type_of(v) for v in values}
        return found | {"integer"} if "number" in found else found
    t = s.get("type")
    if t is None:
        return None
    found = set([t] if isinstance(t, str) else t)
    return found | {"integer"} if "number" in found else found


def _canon(v: Any) -> str:
    """JSON Schema equality for values: 1 == 1.0, but true != 1."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return f"n:{float(v)!r}" if float(v) != int(v) or abs(v) > 2**53 else f"n:{int(v)}"
    if isinstance(v, list):
        return "[" + ",".join(_canon(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_canon(x)}" for k, x in sorted(v.items())) + "}"
    return json.dumps(v)


def disjoint(a: Any, b: Any, root: Any, depth: int = 0) -> bool:
    """True only if no value is valid under both ``a`` and ``b`` (a proof by JSON types,
    by finite value sets, by a property one requires whose values the other excludes, by
    every ``anyOf``/``oneOf`` branch of one being disjoint from the other)."""
    _proof.steps = getattr(_proof, "steps", MAX_PROOF_STEPS) - 1
    if _proof.steps < 0:
        return False  # out of budget: not proven
    a, b = resolve(a, root), resolve(b, root)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict) or depth > 4:
        return False
    if _within_not(a, b, root) or _within_not(b, a, root):
        return True
    ta, tb = json_types(a, root), json_types(b, root)
    if ta is not None and tb is not None and not ta & tb:
        return True
    pa, pb = _literal_prefix(a.get("pattern")), _literal_prefix(b.get("pattern"))
    if pa is not None and pb is not None and not (pa.startswith(pb) or pb.startswith(pa)) \
            and ta is not None and tb is not None and ta | tb <= {"string"}:
        return True
    va, vb = value_set(a), value_set(b)
    if va is not None and vb is not None:
        return not {_canon(v) for v in va} & {_canon(v) for v in vb}
    for x, y in ((a, b), (b, a)):  # every branch of x is disjoint from y
        branches = x.get("anyOf", x.get("oneOf"))
        if isinstance(branches, list) and branches and depth < 3 \
                and all(disjoint(br, y, root, depth + 1) for br in branches):
            return True
    for x, y, tx in ((a, b, ta), (b, a, tb)):
        if tx is None or not tx <= {"object"}:
            continue  # x may match non-objects, where "required" says nothing
        px, py = x.get("properties", {}), y.get("properties", {})
        if not isinstance(px, dict) or not isinstance(py, dict):
            continue
        # a key y does not list must satisfy y's additionalProperties (when no patterns)
        y_extra = y.get("additionalProperties", True) if "patternProperties" not in y else None
        for name in x.get("required", []):
            other = py.get(name, y_extra)
            if other is not None and disjoint(px.get(name, True), other, root, depth + 1):
                return True
    return False


def _literal_prefix(pattern: Any) -> str | None:
    """The literal text every match of an anchored ``^...`` pattern starts with (no
    alternation anywhere); None when there is none to tell."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or "|" in pattern:
        return None
    out, i = [], 1
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            lit, step = pattern[i + 1], 2
        elif ch.isalnum() or ch in "/:-_ ,;=@#%&'\"<>!~`":
            lit, step = ch, 1
        else:
            break
        if pattern[i + step:i + step + 1] in ("?", "*", "{"):
            break
        out.append(lit)
        i += step
    return "".join(out) or None


def _within_not(a: dict, b: dict, root: Any) -> bool:
    """``b`` says ``not X`` and ``a`` is X or an ``allOf`` with X as a member."""
    if "not" not in b or "$ref" in b:
        return False
    x = resolve(b["not"], root)
    if not isinstance(x, dict):
        return False
    return a == x or any(resolve(m, root) == x for m in a.get("allOf", [])
                         if isinstance(a.get("allOf"), list))


_OBJECT_KEYWORDS = frozenset(("properties", "required", "additionalProperties",
                              "patternProperties", "minProperties", "maxProperties"))


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


# Keywords that constrain values of one JSON type only.
_TYPE_KEYWORDS = {
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
              "contains", "minContains", "maxContains", "unevaluatedItems"},
    "object": _OBJECT_KEYWORDS | {"propertyNames", "dependencies", "dependentRequired",
                                  "dependentSchemas", "unevaluatedProperties"},
    "string": {"minLength", "maxLength", "pattern", "format", "contentEncoding",
               "contentMediaType"},
}
_NUMERIC = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}


def _split_overlaps(branches: list, root: Any) -> list | None:
    """Values valid under two ``oneOf`` branches are invalid, so where two branches overlap
    in a way that can be cut exactly, cut the overlap from both (a branch left empty is
    dropped): two enum/const branches lose their common values; a branch that is only a
    ``type`` and another whose other keywords don't apply to some shared type (so every
    value of that type matches both) both lose that type. None when nothing applies."""
    out = []
    for b in branches:
        r = resolve(b, root)
        if not isinstance(r, dict) or "$id" in r or "id" in r:
            out.append(b)
            continue
        out.append({k: v for k, v in r.items() if k not in _DOCUMENT_KEYS})
    changed = False
    for i in range(len(out)):
        for j in range(len(out)):
            a, b = out[i], out[j]
            if i == j or not isinstance(a, dict) or not isinstance(b, dict):
                continue
            if _pure(a, {"enum", "const"}) and _pure(b, {"enum", "const"}) and i < j:
                common = {_canon(v) for v in value_set(a)} & {_canon(v) for v in value_set(b)}
                if common:
                    for k in (i, j):
                        x = out[k]
                        keep = [v for v in value_set(x) if _canon(v) not in common]
                        out[k] = {**{q: w for q, w in x.items() if q not in ("enum", "const")},
                                  "enum": keep}
                    changed = True
            elif _pure(b, set()) and "type" in a:
                shared = _type_list(a) & _type_list(b) - {"integer", "number"}
                rest = set(a) - ANNOTATIONS - {"type"}
                cut = {t for t in shared if not rest & _TYPE_KEYWORDS.get(t, set())}
                if cut and not rest - set().union(*_TYPE_KEYWORDS.values()) - _NUMERIC:
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
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()


def _typed_object(b: Any, root: Any) -> Any:
    r = resolve(b, root)
    if not isinstance(r, dict) or "type" in r or "$ref" in r or "$id" in r or "id" in r:
        return b
    keys = set(r) - ANNOTATIONS - set(_DOCUMENT_KEYS)
    if not keys or not keys <= _OBJECT_KEYWORDS:
        return b
    return {**{k: v for k, v in r.items() if k not in _DOCUMENT_KEYS}, "type": "object"}


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


def all_disjoint(branches: list, root: Any) -> bool:
    """No two ``oneOf`` branches can match the same value (so ``oneOf`` is ``anyOf``)."""
    return all(disjoint(branches[i], branches[j], root)
               for i in range(len(branches)) for j in range(i))


# -------------------------------------------------------------------------------- not


def negate(sub: Any, own: dict, root: Any) -> dict | bool | None:
    """``not: sub`` inside the schema ``own`` as assertions to add to ``own`` (a dict), False
    when nothing is left, or None when the form is not one we can rewrite (see module doc)."""
    if sub in ({}, True):
        return False
    sub = resolve(sub, root)
    if not isinstance(sub, dict):
        return None
    keys = set(sub) - ANNOTATIONS
    own_types = json_types({"type": own["type"]}, root) if "type" in own else None
    if keys == {"type"}:
        return _negate_type(sub["type"], own.get("type"))
    if keys == {"required"} or keys == {"required", "properties"}:
        req, props = sub["required"], sub.get("properties", {})
        if isinstance(req, list) and len(req) == 1 and isinstance(props, dict) \
                and all(v in ({}, True) for v in props.values()):
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
