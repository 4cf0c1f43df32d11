"""What a JSON schema says, read without compiling it: the facts both schema consumers (the
regex translator and the llguidance rewrite) ask about.

- Vocabulary: the JSON types, the standard keywords that assert something, the keywords
  each of which constrains one JSON type only, annotations, and where subschemas sit in a
  schema (``SCHEMA_MAPS`` / ``SCHEMA_LISTS`` / ``SCHEMA_ONE``).
- References: ``pointer_target`` (a local ``$ref``'s JSON pointer) and ``follow_ref`` (a bare
  local ``$ref`` followed to its target).
- Values and types: ``value_set`` (the finite values of ``const`` / ``enum``),
  ``json_type`` of a value, ``type_names`` of a ``type`` keyword, ``json_types`` (the types
  a subschema can match).
- Disjointness: ``disjoint`` proves that no value is valid under two schemas (within a step
  budget per thread, ``start_proofs``).

The regex translator asks a narrower question of ``oneOf`` branches than ``disjoint``
answers: whether a value *it generates* for one branch (closed objects, capped repeats) can
be valid under another. It proves that with the validator on finite value sets and with the
types it generates (``regex_oneof``), so it keeps its own proof.
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import unquote

ALL_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
# Standard vocabulary (drafts 3 to 2020-12) that asserts something about an instance.
ASSERTION_KEYWORDS = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern items additionalItems prefixItems maxItems minItems uniqueItems "
    "contains minContains maxContains maxProperties minProperties required properties "
    "patternProperties additionalProperties dependencies dependentRequired dependentSchemas "
    "propertyNames if then else allOf anyOf oneOf not $ref $dynamicRef $recursiveRef "
    "unevaluatedItems unevaluatedProperties format disallow extends divisibleBy".split()
)
# Standard format names the format checker may assert; unknown names are annotations only.
KNOWN_FORMATS = frozenset(
    "date-time date time duration email idn-email hostname idn-hostname ipv4 ipv6 uri "
    "uri-reference iri iri-reference uuid uri-template json-pointer relative-json-pointer "
    "regex color host-name ip-address utc-millisec".split()
)
ANNOTATIONS = frozenset(("title", "description", "$comment", "examples", "default"))
# Keys that place a schema in its document: stay on the node, never copied into branches.
DOCUMENT_KEYS = ("$schema", "$id", "id", "$anchor", "$defs", "definitions")
# Where subschemas sit: maps of them, lists of them, one of them ("items" is either).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_ONE = ("additionalProperties", "additionalItems", "not", "if", "then", "else",
              "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
# Schemas that admit every value ({"not": x} of one of them admits none).
ANY_VALUE = ({}, True)

# Keywords that constrain values of one JSON type only. The first groups are the ones the
# regex translator enforces (a schema without "type" that uses one generates that type);
# TYPE_KEYWORDS adds the rest of each type's vocabulary.
OBJECT_BASIC_KW = ("properties", "required", "additionalProperties", "patternProperties",
                   "minProperties", "maxProperties")
OBJECT_KW = OBJECT_BASIC_KW + ("dependencies", "dependentRequired", "dependentSchemas",
                               "propertyNames")
ARRAY_KW = ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems")
STRING_KW = ("minLength", "maxLength", "pattern", "format")
NUMBER_KW = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
TYPE_KEYWORDS = {
    "array": {*ARRAY_KW, "contains", "minContains", "maxContains", "unevaluatedItems"},
    "object": {*OBJECT_KW, "unevaluatedProperties"},
    "string": {*STRING_KW, "contentEncoding", "contentMediaType"},
}
NUMERIC_KEYWORDS = set(NUMBER_KW)

# ------------------------------------------------------------------------------ references


def pointer_target(root: Any, ref: str) -> Any:
    """What the local reference ``ref`` ("#" or "#/a/0/b", JSON-pointer escapes and
    percent-encoding decoded) names in ``root``; KeyError when nothing is there."""
    target = root
    for part in unquote(ref[1:]).split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        elif isinstance(target, dict) and part in target:
            target = target[part]
        else:
            raise KeyError(ref)
    return target


def follow_ref(s: Any, root: Any, depth: int = 0) -> Any:
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


# -------------------------------------------------------------------------- values, types


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def json_type(v: Any) -> str:
    """The JSON type of a parsed JSON value; every number is "number"."""
    return {bool: "boolean", type(None): "null", str: "string", dict: "object",
            list: "array"}.get(type(v), "number")


def type_names(t: Any) -> list[str]:
    """A ``type`` keyword's value (one name or a list) as a list."""
    return [t] if isinstance(t, str) else list(t)


def value_set(s: dict, lenient: bool = False) -> list | None:
    """The values ``const`` or ``enum`` allows (None when ``s`` has neither). An ``enum`` that
    is not a list counts only when ``lenient`` (its items, as ``in`` sees them): the regex
    translator walks any JSON a ``$ref`` points at, schema position or not, and reads it so."""
    if "const" in s:
        return [s["const"]]
    if "enum" not in s:
        return None
    enum = s["enum"]
    return enum if isinstance(enum, list) else list(enum) if lenient else None


def json_types(s: Any, root: Any) -> set[str] | None:
    """The JSON types a subschema can match, from ``type``/``const``/``enum`` (following
    local ``$ref``s); None when it can't be told. ``number`` includes ``integer``."""
    s = follow_ref(s, root)
    if not isinstance(s, dict):
        return None
    values = value_set(s)
    if values is not None:
        found = {json_type(v) for v in values}
        return found | {"integer"} if "number" in found else found
    t = s.get("type")
    if t is None:
        return None
    found = set(type_names(t))
    return found | {"integer"} if "number" in found else found


def canon(v: Any) -> str:
    """JSON Schema equality for values: 1 == 1.0, but true != 1."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return f"n:{float(v)!r}" if float(v) != int(v) or abs(v) > 2**53 else f"n:{int(v)}"
    if isinstance(v, list):
        return "[" + ",".join(canon(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{canon(x)}" for k, x in sorted(v.items())) + "}"
    return json.dumps(v)


# ---------------------------------------------------------------------------- disjointness

# Steps (``disjoint`` calls) of the proofs about one schema, unless the caller sets its own
# budget with ``start_proofs``: past it, nothing more is proven, so a hostile schema cannot
# hold a thread in the prover.
MAX_PROOF_STEPS = 20_000
_proof = threading.local()


def start_proofs(steps: int) -> None:
    """Give this thread's next disjointness proofs a budget of ``steps`` steps."""
    _proof.steps = steps


def disjoint(a: Any, b: Any, root: Any, depth: int = 0) -> bool:
    """True only if no value is valid under both ``a`` and ``b`` (a proof by JSON types,
    by finite value sets, by a property one requires whose values the other excludes, by
    every ``anyOf``/``oneOf`` branch of one being disjoint from the other)."""
    _proof.steps = getattr(_proof, "steps", MAX_PROOF_STEPS) - 1
    if _proof.steps < 0:
        return False  # out of budget: not proven
    a, b = follow_ref(a, root), follow_ref(b, root)
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
        return not {canon(v) for v in va} & {canon(v) for v in vb}
    for x, y in ((a, b), (b, a)):  # every branch of x is disjoint from y
        branches = x.get("anyOf", x.get("oneOf"))
        if isinstance(branches, list) and branches and depth < 3 \
                and all(disjoint(br, y, root, depth + 1) for br in branches):
            return True
    return _required_disjoint(a, b, ta, tb, root, depth)


def _required_disjoint(a: dict, b: dict, ta: set[str] | None, tb: set[str] | None, root: Any,
                       depth: int) -> bool:
    """One side matches objects only and requires a property whose values the other side's
    schema for that name (or its additionalProperties) excludes."""
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


def all_disjoint(branches: list, root: Any) -> bool:
    """No two ``oneOf`` branches can match the same value (so ``oneOf`` is ``anyOf``)."""
    return all(disjoint(branches[i], branches[j], root)
               for i in range(len(branches)) for j in range(i))


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
    x = follow_ref(b["not"], root)
    if not isinstance(x, dict):
        return False
    return a == x or any(follow_ref(m, root) == x for m in a.get("allOf", [])
                         if isinstance(a.get("allOf"), list))
