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

Last, subschemas that occur twice or more are moved to ``$defs`` and referenced, so that
llguidance builds each once (``llg_share``).

The ``oneOf`` rewrite is in ``llg_oneof``, the ``not`` forms in ``llg_negation``; what both
backends know about schemas (types, value sets, ``$ref``, disjointness) in ``analysis``.
"""

from __future__ import annotations

from typing import Any

from radixlm.constraints import regex_parts as rp
from radixlm.constraints.schema.analysis import (
    ANNOTATIONS,
    ANY_VALUE,
    DOCUMENT_KEYS,
    KNOWN_FORMATS,
    MAX_PROOF_STEPS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_ONE,
    json_types,
    start_proofs,
)
from radixlm.constraints.schema.llg_negation import negate
from radixlm.constraints.schema.llg_oneof import one_of_as_any_of
from radixlm.constraints.schema.llg_share import share_repeats

# Formats llguidance 1.9 implements; others are rewritten (FORMAT_ALIASES, pattern) or refused.
LLG_FORMATS = frozenset("date-time time date duration email hostname ipv4 ipv6 uuid uri".split())
FORMAT_ALIASES = {"uri-reference": "uri", "iri": "uri", "iri-reference": "uri", "url": "uri",
                  "idn-email": "email", "idn-hostname": "hostname", "host-name": "hostname",
                  "ip-address": "ipv4"}
FORMAT_PATTERNS = {f: "^" + rp.FORMATS[f][1:-1] + "$" for f in ("color", "json-pointer", "regex")}
MAX_DEPENDENCY_VARIANTS = 8
# MAX_PROOF_STEPS (from analysis): the budget of oneOf proofs each prepare_schema call starts
# with; past it, oneOf is left for the compiler to refuse.
_DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
# What prepare_schema acts on: a node with none of these keywords is copied as it is (most
# nodes of a large document are such leaves)
_ACTED_ON = frozenset((*SCHEMA_MAPS, *SCHEMA_LISTS, *SCHEMA_ONE, "items", "uniqueItems",
                       "format", *_DEPENDENCY_KEYS))
# Keywords that assert something but that llguidance neither implements nor reports.
UNREPORTED_KEYWORDS = ("disallow", "extends", "divisibleBy")


def prepare_schema(schema: Any, in_all_of: bool = False, root: Any = None) -> Any:
    """A copy of ``schema`` with the rewrites in the module docstring applied at every
    schema position. ``in_all_of``: the node is an ``allOf`` member (never closed)."""
    if not isinstance(schema, dict):
        return schema
    if root is None:  # the document: rewritten, then its repeats shared
        start_proofs(MAX_PROOF_STEPS)
        return share_repeats(prepare_schema(schema, in_all_of, schema))
    if _ACTED_ON.isdisjoint(schema):
        return dict(schema)
    out = dict(schema)
    listed = isinstance(schema.get("properties"), dict)  # before "not" may add some
    if isinstance(out.get("oneOf"), list) and "anyOf" not in out:
        branches = one_of_as_any_of(out["oneOf"], root)
        if branches is not None:
            del out["oneOf"]
            out["anyOf"] = branches
    if "anyOf" in out and "type" in out and _implied_type(out, root):
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
    _prepare_subschemas(out, in_all_of, root, schema is root)
    props = out.get("properties")
    required = out.get("required") if isinstance(out.get("required"), list) else []
    if (listed and isinstance(props, dict) and not in_all_of and all(r in props for r in required)
            and not any(k in out for k in ("additionalProperties", "patternProperties",
                                           "unevaluatedProperties", "allOf", "$ref"))):
        out["additionalProperties"] = False
    if any(k in out for k in _DEPENDENCY_KEYS):
        return _with_dependencies(out, root)
    return out


def _prepare_subschemas(out: dict, in_all_of: bool, root: Any, at_root: bool) -> None:
    """``prepare_schema`` applied to every subschema of ``out`` (in place)."""
    in_all_ofs = _all_of_targets(root) if at_root else set()
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict) and key != "dependentSchemas":  # (_with_dependencies)
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
    if set(out) - ANNOTATIONS - set(DOCUMENT_KEYS) != {"type", "anyOf"} \
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
                props[name] = sub if sub is False or old in ANY_VALUE \
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
    keep = {k: v for k, v in base.items() if k in ANNOTATIONS or k in DOCUMENT_KEYS}
    return {**keep, "anyOf": [{k: v for k, v in x.items() if k not in DOCUMENT_KEYS}
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


def unenforced_keywords(schema: Any, ptr: str = "") -> list[str]:
    """``keyword at JSON pointer`` for every keyword in schema positions llguidance would
    silently ignore."""
    if not isinstance(schema, dict):
        return []
    out = [f"'{k}' at JSON pointer '{ptr or '/'}'" for k in UNREPORTED_KEYWORDS if k in schema]
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                out += unenforced_keywords(sub, f"{ptr}/{key}/{name}")
    for key in SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                out += unenforced_keywords(sub, f"{ptr}/{key}/{i}")
    for key in SCHEMA_ONE:
        out += unenforced_keywords(schema.get(key), f"{ptr}/{key}")
    items = schema.get("items")
    if isinstance(items, list):
        for i, sub in enumerate(items):
            out += unenforced_keywords(sub, f"{ptr}/items/{i}")
    else:
        out += unenforced_keywords(items, f"{ptr}/items")
    return out
