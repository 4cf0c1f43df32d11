"""The regex translator's keyword-level parts: its failure kinds, the keyword-wise
intersection of two schemas (``allOf`` members, ``$ref`` siblings), the types a schema
without ``type`` generates, and the regexes of scalar values (null, boolean, integer,
number, string) under their keywords."""

from __future__ import annotations

import re

from radixlm.constraints import regex_parts as rp
from radixlm.constraints.schema.analysis import (
    ALL_TYPES,
    ARRAY_KW,
    ASSERTION_KEYWORDS,
    KNOWN_FORMATS,
    NUMBER_KW,
    OBJECT_KW,
    STRING_KW,
    is_num,
    type_names,
)

MAX_REPEAT = 64  # longest bounded repeat we emit (maxLength / maxItems are capped to it)
CLOSED = "x-radixlm-closed"  # internal marker: never emit an undeclared property here


class Unsat(Exception):
    """This subschema admits nothing we can generate."""


class TooDeep(Exception):
    """A recursive $ref went past the depth limit here, or the regex grew past its budget."""


class Reject(ValueError):
    """A construct we can't translate exactly (message names the keyword and pointer)."""


def reject(what: str, ptr: str) -> ValueError:
    return Reject(f"{what} at JSON pointer '{ptr or '/'}'")


def search(pattern: str, name: str, ptr: str) -> bool:
    """``patternProperties`` pattern ``pattern`` matches property ``name``."""
    try:
        return re.search(pattern, name) is not None
    except (re.error, RecursionError) as exc:
        raise reject(f"unsupported keyword 'patternProperties' ({pattern!r}: {exc})",
                     ptr) from None


def has_any(s: dict, keys: tuple[str, ...]) -> bool:
    return any(k in s for k in keys)


def infer_types(s: dict) -> list[str]:
    """Types to generate when ``type`` is absent: the one the keywords talk about (a sound
    subset), or every type (with scalar-only containers) when they say nothing."""
    for keys, types in ((OBJECT_KW, ["object"]), (ARRAY_KW, ["array"]),
                        (STRING_KW, ["string"]), (NUMBER_KW, ["number"])):
        if has_any(s, keys):
            return types
    return list(ALL_TYPES)


# ------------------------------------------------------------------------------- merging


def merge(a: dict, b: dict, ptr: str) -> dict:
    """Keyword-wise intersection of two schemas; ValueError where we can't merge."""
    out = dict(a)
    for k, v in b.items():
        if k not in out or out[k] == v or k not in ASSERTION_KEYWORDS:
            out.setdefault(k, v)
            continue
        w = out[k]
        if k == "required":
            out[k] = list(dict.fromkeys(w + v))
        elif k == "properties":
            props = dict(w)
            for name, sub in v.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[k] = props
        elif k == "type":
            ta, tb = type_names(w), type_names(v)
            both = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
            both += [t for t in tb if t == "integer" and "number" in ta and t not in both]
            if not both:
                raise Unsat(f"types {w} and {v} don't meet at '{ptr}'")
            out[k] = both
        elif k in ("minLength", "minItems", "minProperties") and is_num(w) and is_num(v):
            out[k] = max(w, v)
        elif k in ("maxLength", "maxItems", "maxProperties") and is_num(w) and is_num(v):
            out[k] = min(w, v)
        elif k in ("anyOf", "oneOf", "items", "additionalProperties", "propertyNames"):
            if w is False or v is False:
                out[k] = False
            elif k in ("anyOf", "oneOf"):
                out["allOf"] = [{k: w}, {k: v}]
                del out[k]
            elif isinstance(w, dict) and isinstance(v, dict):
                out[k] = {"allOf": [w, v]}
            else:
                raise reject(f"cannot combine two different '{k}' (allOf/$ref siblings)", ptr)
        elif k == "enum":
            out[k] = [x for x in w if x in v]
        else:
            raise reject(f"cannot combine two different '{k}' (allOf/$ref siblings)", ptr)
    return _close(a, b, out, ptr)


def _close(a: dict, b: dict, out: dict, ptr: str) -> dict:
    """A side with additionalProperties/patternProperties judges the other side's extra
    property names too: names it declares or matches by pattern stay (t_object merges
    the pattern schemas in), names its additionalProperties schema covers get that
    schema too, and names it forbids are never emitted."""
    props = dict(out.get("properties", {}))
    for x in (a, b):
        extra = x.get("additionalProperties", True)
        if extra is True and "patternProperties" not in x:
            continue
        own, pats = x.get("properties", {}), x.get("patternProperties", {})
        for name in list(props):
            if name in own or any(search(p, name, ptr) for p in pats):
                continue
            if extra is False:
                del props[name]
            elif extra is not True:
                props[name] = {"allOf": [props[name], extra]}
        out[CLOSED] = True
    if "properties" in out or props:
        out["properties"] = props
    return out


# -------------------------------------------------------------------------------- scalars


def scalar_regex(t: str, s: dict, ptr: str, draft4: bool) -> str:
    """The regex of a value of scalar type ``t`` under the keywords of ``s``."""
    if t == "null":
        return rp.NULL
    if t == "boolean":
        return rp.BOOLEAN
    if t == "integer":
        return _integer(s, ptr, draft4)
    if t == "number":
        return _number(s, ptr, draft4)
    return _string(s, ptr)


def _integer(s: dict, ptr: str, draft4: bool) -> str:
    m = s.get("multipleOf", s.get("divisibleBy"))
    if m is not None and not (is_num(m) and float(m) == 1.0):
        raise reject("unsupported keyword 'multipleOf' (only 1 on integers)", f"{ptr}/multipleOf")
    if not has_any(s, NUMBER_KW[:4]):
        return rp.INTEGER
    lo, hi = rp.integer_bounds(s, draft4)
    if lo is not None and hi is not None and lo > hi:
        raise Unsat(f"empty integer range at '{ptr}'")
    return rp.int_range_regex(lo, hi)


def _number(s: dict, ptr: str, draft4: bool) -> str:
    if "multipleOf" in s or "divisibleBy" in s:
        raise reject("unsupported keyword 'multipleOf' on numbers", f"{ptr}/multipleOf")
    if not has_any(s, NUMBER_KW[:4]):
        return rp.NUMBER
    try:
        return rp.number_bounded_regex(s, draft4)
    except ValueError:
        raise Unsat(f"empty number range at '{ptr}'") from None


def _string(s: dict, ptr: str) -> str:
    fmt = s.get("format")
    if fmt is not None and fmt not in rp.FORMATS and fmt in KNOWN_FORMATS:
        raise reject(f"unsupported keyword 'format' ({fmt!r})", f"{ptr}/format")
    fmt = fmt if fmt in rp.FORMATS else None
    present = [k for k in ("pattern", "minLength", "maxLength") if k in s]
    if fmt and present:
        raise reject(f"unsupported keyword '{present[0]}' next to 'format'",
                     f"{ptr}/{present[0]}")
    if fmt:
        return rp.FORMATS[fmt]
    if "pattern" in s:
        if len(present) > 1:
            raise reject(f"unsupported keyword '{present[1]}' next to 'pattern'",
                         f"{ptr}/{present[1]}")
        try:
            return rp.pattern_to_json_string_regex(s["pattern"])
        except ValueError as exc:
            raise reject(f"unsupported keyword 'pattern': {exc}", f"{ptr}/pattern") from None
    lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
    if hi is not None and lo > hi:
        raise Unsat(f"minLength > maxLength at '{ptr}'")
    if hi is None:
        return f'"{rp.STRING_CHAR}' + ("*" if lo == 0 else f"{{{lo},}}") + '"'
    # Counted: unescaped characters only (a subset; see regex_parts.PLAIN_CHAR).
    return f'"{rp.PLAIN_CHAR}{{{lo},{max(lo, min(int(hi), MAX_REPEAT))}}}"'
