"""JSON Schema -> regex, sound by construction: every string the regex matches parses as JSON
and validates against the schema (checked by ``jsonschema`` in the tests). Completeness is
not promised: where the exact language is out of reach we generate a subset (objects are
closed, properties come in declared order, ``uniqueItems`` arrays hold at most one item,
long repeats are capped) or reject the schema with a ``ValueError`` naming the keyword and
its JSON pointer.

Why not ``outlines_core.json_schema.build_regex_from_schema``: in 0.2.14 it silently drops
keywords (minimum/maximum, pattern next to minLength, allOf concatenates branch regexes,
oneOf acts as anyOf) and emits ``pattern`` and some formats raw inside a JSON string (a
``"`` in the pattern breaks the JSON). We walk the schema with an allow-list instead and use
the building blocks in ``regex_parts``; the token-level index is still outlines-core's.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import jsonschema

from radixlm.constraints import regex_parts as rp
from radixlm.constraints.base import DEFAULT_SEPARATORS

# Standard vocabulary (drafts 3 to 2020-12) that asserts something about an instance.
ASSERTION_KEYWORDS = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern items additionalItems prefixItems maxItems minItems uniqueItems "
    "contains minContains maxContains maxProperties minProperties required properties "
    "patternProperties additionalProperties dependencies dependentRequired dependentSchemas "
    "propertyNames if then else allOf anyOf oneOf not $ref $dynamicRef $recursiveRef "
    "unevaluatedItems unevaluatedProperties format disallow extends divisibleBy".split()
)
_NOTHING = ({}, True)  # {"not": {}} / {"not": true} admit no value: same as the false schema
# The ones this translator enforces exactly (or by a sound restriction, see module doc).
ENFORCED_KEYWORDS = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern items additionalItems prefixItems maxItems minItems uniqueItems "
    "maxProperties minProperties required properties patternProperties additionalProperties "
    "dependencies dependentRequired dependentSchemas propertyNames allOf anyOf oneOf $ref "
    "format".split()
)
OBJECT_KW = ("properties", "required", "additionalProperties", "patternProperties",
             "minProperties", "maxProperties", "dependencies", "dependentRequired",
             "dependentSchemas", "propertyNames")
ARRAY_KW = ("items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems")
STRING_KW = ("minLength", "maxLength", "pattern", "format")
NUMBER_KW = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
ALL_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
# Standard format names the format checker may assert; unknown names are annotations only.
KNOWN_FORMATS = frozenset(
    "date-time date time duration email idn-email hostname idn-hostname ipv4 ipv6 uri "
    "uri-reference iri iri-reference uuid uri-template json-pointer relative-json-pointer "
    "regex color host-name ip-address utc-millisec".split()
)
MAX_REPEAT = 64  # longest bounded repeat we emit (maxLength / maxItems are capped to it)
_CLOSED = "x-radixlm-closed"  # internal marker: never emit an undeclared property here
ANY_SCALAR = f"(?:{rp.STRING}|{rp.NUMBER}|{rp.BOOLEAN}|{rp.NULL})"


class _Unsat(Exception):
    """This subschema admits nothing we can generate."""


class _TooDeep(Exception):
    """A recursive $ref went past the depth limit here, or the regex grew past its budget."""


class _Reject(ValueError):
    """A construct we can't translate exactly (message names the keyword and pointer)."""


def _err(what: str, ptr: str) -> ValueError:
    return _Reject(f"{what} at JSON pointer '{ptr or '/'}'")


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


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v == int(v)):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(v)]


def check_schema(schema: Any) -> type:
    """Validate ``schema`` against its metaschema; returns the validator class."""
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"json_schema must be an object or a boolean, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        ptr = "/" + "/".join(str(p) for p in exc.path)
        raise _err(f"invalid JSON schema: {exc.message}", ptr) from None
    return cls


def check_whitespace_pattern(pattern: str) -> None:
    """The whitespace regex may only ever match JSON whitespace (space, tab, CR, LF)."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid whitespace_pattern {pattern!r}: {exc}") from exc
    body = re.sub(r"\\[ tnr]|\\x(?:09|0A|0D|20)|\{\d+(,\d*)?\}|[ ?*+()|\[\]]", "", pattern)
    if body or compiled.fullmatch("x"):
        raise ValueError(f"whitespace_pattern {pattern!r} may match non-whitespace")


class SchemaTranslator:
    """Translate one (metaschema-valid) JSON schema into a regex. Not reusable."""

    def __init__(self, root: Any, validator_cls: type, whitespace: str | None,
                 max_ref_depth: int = 3,
                 max_regex_chars: int = 100_000, strict: bool = True):
        """``whitespace``: the regex allowed between JSON tokens, or None for the default
        style (``", "`` between items, ``": "`` after keys, no other whitespace).
        ``strict``: reject the schema for any unsupported construct. Otherwise a construct
        in an optional place (optional property, anyOf/oneOf branch, items of a possibly
        empty array) is pruned, i.e. never generated, which is sound but less complete."""
        self.root = root
        self.droppable: tuple[type, ...] = (_Unsat, _TooDeep) + (() if strict else (_Reject,))
        self.max_regex_chars = max_regex_chars
        if whitespace is None:  # the default style: ", " and ": ", nothing else
            self.ws, (self.comma, self.colon) = "", DEFAULT_SEPARATORS
            self.dump_separators = DEFAULT_SEPARATORS
        else:
            self.ws = f"(?:{whitespace})"
            self.comma, self.colon = f"{self.ws},{self.ws}", f"{self.ws}:{self.ws}"
            self.dump_separators = (",", ":")
        self.max_ref_depth = max_ref_depth
        self.draft4 = validator_cls.META_SCHEMA.get("$schema", "").find("draft-04") >= 0
        meta = validator_cls.META_SCHEMA.get("$schema", "")
        if "draft-03" in meta:
            raise ValueError("unsupported JSON-schema draft: draft-03 ('$schema')")
        self.draft2020 = "2020-12" in meta
        # Before 2019-09, keywords next to $ref are ignored by validators.
        self.ref_siblings = "2019-09" in meta or self.draft2020
        self.validator = validator_cls(root, format_checker=validator_cls.FORMAT_CHECKER)
        self.ref_stack: list[str] = []
        self.memo: dict[tuple, str | Exception] = {}
        self.work = 0  # characters of regex built so far, kept or not

    def translate(self) -> str:
        try:
            return self.node(self.root, "")
        except _Unsat as exc:
            raise ValueError(f"schema admits no value this backend can generate: {exc}") from None
        except _TooDeep as exc:
            raise ValueError(
                f"schema too large: recursive $ref deeper than {self.max_ref_depth} levels or "
                f"regex over {self.max_regex_chars} characters, with no optional way out: {exc}"
            ) from None

    # ----------------------------------------------------------------------------- structure

    def node(self, s: Any, ptr: str) -> str:
        if s is True:
            return self.any_value()
        if s is False or (isinstance(s, dict) and s.get("not", 0) in _NOTHING):
            raise _Unsat(f"'false' schema at '{ptr}'")
        key = (json.dumps(s, sort_keys=True, default=str), tuple(self.ref_stack))
        hit = self.memo.get(key)
        if isinstance(hit, Exception):
            raise hit
        if hit is not None:
            return hit
        s, pushed = self.resolve(s, ptr)
        try:
            out = self._node(s, ptr)
            self.work += len(out)
            if self.work > 200 * self.max_regex_chars:
                raise ValueError(f"schema too large: translation built over "
                                 f"{200 * self.max_regex_chars} characters of regex")
            if len(out) > self.max_regex_chars:
                raise _TooDeep(f"regex over {self.max_regex_chars} characters at '{ptr}'")
            self.memo[key] = out
            return out
        except (_Unsat, _TooDeep, _Reject) as exc:
            self.memo[key] = exc
            raise
        finally:
            del self.ref_stack[len(self.ref_stack) - pushed:]

    def resolve(self, s: dict, ptr: str) -> tuple[dict, int]:
        """Inline $ref and allOf into one dict (intersection by keyword merge)."""
        pushed = 0
        while "$ref" in s or "allOf" in s:
            if "$ref" in s:
                ref = s["$ref"]
                if self.ref_stack.count(ref) >= self.max_ref_depth:
                    raise _TooDeep(f"'{ref}' at '{ptr}'")
                self.ref_stack.append(ref)
                pushed += 1
                target = self.lookup(ref, ptr)
                if target is False:
                    raise _Unsat(f"$ref to 'false' at '{ptr}'")
                rest = {k: v for k, v in s.items() if k != "$ref" and self.ref_siblings}
                s = self.merge(rest, {} if target is True else target, ptr)
            else:
                rest = {k: v for k, v in s.items() if k != "allOf"}
                for i, sub in enumerate(s["allOf"]):
                    if sub is False:
                        raise _Unsat(f"'false' in allOf at '{ptr}/allOf/{i}'")
                    if sub is not True:
                        sub, n = self.resolve(sub, f"{ptr}/allOf/{i}")
                        pushed += n
                        rest = self.merge(rest, sub, f"{ptr}/allOf/{i}")
                s = rest
        return s, pushed

    def lookup(self, ref: str, ptr: str) -> Any:
        if not ref.startswith("#"):
            raise _err(f"unsupported keyword '$ref' (only local references, got {ref!r})", ptr)
        try:
            return pointer_target(self.root, ref)
        except KeyError:
            raise _err(f"unresolvable '$ref' {ref!r}", ptr) from None

    def merge(self, a: dict, b: dict, ptr: str) -> dict:
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
                ta, tb = _types(w), _types(v)
                both = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
                both += [t for t in tb if t == "integer" and "number" in ta and t not in both]
                if not both:
                    raise _Unsat(f"types {w} and {v} don't meet at '{ptr}'")
                out[k] = both
            elif k in ("minLength", "minItems", "minProperties") and _is_num(w) and _is_num(v):
                out[k] = max(w, v)
            elif k in ("maxLength", "maxItems", "maxProperties") and _is_num(w) and _is_num(v):
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
                    raise _err(f"cannot combine two different '{k}' (allOf/$ref siblings)", ptr)
            elif k == "enum":
                out[k] = [x for x in w if x in v]
            else:
                raise _err(f"cannot combine two different '{k}' (allOf/$ref siblings)", ptr)
        return self._close(a, b, out, ptr)

    def _close(self, a: dict, b: dict, out: dict, ptr: str) -> dict:
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
                if name in own or any(_search(p, name, ptr) for p in pats):
                    continue
                if extra is False:
                    del props[name]
                elif extra is not True:
                    props[name] = {"allOf": [props[name], extra]}
            out[_CLOSED] = True
        if "properties" in out or props:
            out["properties"] = props
        return out

    def _node(self, s: dict, ptr: str) -> str:
        for k in s:
            if k in ASSERTION_KEYWORDS and k not in ENFORCED_KEYWORDS:
                raise _err(f"unsupported JSON-schema keyword '{k}'", f"{ptr}/{k}")
        if "anyOf" in s or "oneOf" in s:
            return self.alternatives(s, ptr)
        if "enum" in s or "const" in s:
            return self.literals(s, ptr)
        types = _types(s["type"]) if "type" in s else _infer_types(s)
        alts = []
        for t in types:
            if t not in ALL_TYPES:
                raise _err(f"unsupported type {t!r}", f"{ptr}/type")
            try:
                alts.append(getattr(self, f"t_{t}")(s, ptr))
            except self.droppable:
                if len(types) == 1:
                    raise
        if not alts:
            raise _Unsat(f"no type of {types} admits a value at '{ptr}'")
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    def alternatives(self, s: dict, ptr: str) -> str:
        key = "anyOf" if "anyOf" in s else "oneOf"
        rest = {k: v for k, v in s.items() if k != key}
        branches = []  # (merged branch, its pointer, the $refs inlined into it)
        depth = len(self.ref_stack)
        for i, b in enumerate(s[key]):
            if b is False:
                continue
            sub_ptr = f"{ptr}/{key}/{i}"
            try:
                if b is not True:
                    b, _ = self.resolve(b, sub_ptr)
                merged, _ = self.resolve(self.merge(rest, {} if b is True else b, sub_ptr),
                                         sub_ptr)
            except self.droppable:
                continue
            finally:
                refs = self.ref_stack[depth:]
                del self.ref_stack[depth:]
            branches.append((merged, sub_ptr, refs))
        if key == "oneOf":
            merged = self.make_disjoint([b[0] for b in branches], f"{ptr}/oneOf")
            branches = [(m, p, r) for m, (_, p, r) in zip(merged, branches)]
        alts = []
        for merged, sub_ptr, refs in branches:
            self.ref_stack += refs
            try:
                alts.append(self._node(merged, sub_ptr))
            except self.droppable:
                continue
            finally:
                del self.ref_stack[depth:]
        if not alts:
            raise _Unsat(f"no branch of '{key}' at '{ptr}' admits a value")
        return "(?:" + "|".join(alts) + ")"

    def make_disjoint(self, branches: list[dict], ptr: str) -> list[dict]:
        """oneOf is sound as an alternation only if no value we generate for one branch is
        valid under another: prove it by type, by enum/const, or by a discriminating
        property (required in one, absent/forbidden/of disjoint values in the other). Where
        branch j requires a property that branch i merely allows, branch i is narrowed to
        never emit it."""
        out = [dict(b) for b in branches]
        for i in range(len(out)):
            for j in range(len(out)):
                a, b = out[i], branches[j]  # narrowed i against the real j
                if i == j or self.excludes(a, b):
                    continue
                missing = [q for q in b.get("required", []) if q not in a.get("required", [])]
                gen = self.gen_types(a)
                if missing and gen <= {"object"}:
                    props = {k: v for k, v in a.get("properties", {}).items() if k not in missing}
                    out[i] = {**a, "properties": props, _CLOSED: True}
                    continue
                pa, pb = a.get("properties", {}), b.get("properties", {})
                tags = [q for q in pa if isinstance(pa[q], dict) and isinstance(pb.get(q), dict)
                        and "$ref" not in pa[q] and self.excludes(pa[q], pb[q])]
                if tags and gen <= {"object"}:  # make a discriminating property required
                    out[i] = {**a, "required": list(a.get("required", [])) + tags[:1]}
                    continue
                if "type" in b and "enum" not in a and "const" not in a:
                    bt = set(_types(b["type"]))
                    bt |= {"integer", "number"} if bt & {"integer", "number"} else set()
                    keep = [t for t in ALL_TYPES if t in gen - bt]
                    if keep and (gen - bt) != gen:
                        out[i] = {**a, "type": keep}
                        continue
                raise _err(f"unsupported 'oneOf': branches {i} and {j} may overlap", ptr)
        return out

    def gen_types(self, s: Any, depth: int = 0) -> set[str]:
        """JSON types of the values we may generate for ``s`` (integer implies number)."""
        if s is True or depth > 8:
            return set(ALL_TYPES)
        if s is False:
            return set()
        if "$ref" in s and not self.ref_siblings:
            return self.gen_types(self.lookup(s["$ref"], ""), depth + 1)
        vals = _value_set(s)
        if vals is not None:
            out = {_json_type(v) for v in vals}
        elif "type" in s:
            out = set(_types(s["type"]))
        elif "$ref" in s:
            return self.gen_types(self.lookup(s["$ref"], ""), depth + 1)
        elif "anyOf" in s or "oneOf" in s:
            out = set()
            for b in s.get("anyOf", s.get("oneOf")):
                out |= self.gen_types(b, depth + 1)
        else:
            out = set(_infer_types(s))
        return out | ({"number"} if "integer" in out else set())

    def excludes(self, a: dict, b: dict) -> bool:
        """True if no value generated for ``a`` can be valid under ``b``."""
        va = _value_set(a)
        if va is not None:  # finite: ask the validator directly
            return all(any(True for _ in self.validator.descend(v, b)) for v in va)
        if "type" in b:
            allowed = set(_types(b["type"]))
            if "number" in allowed:
                allowed.add("integer")
            if not (self.gen_types(a) & allowed):
                return True
        pa, pb = a.get("properties", {}), b.get("properties", {})
        b_closed = b.get("additionalProperties", True) is False and "patternProperties" not in b
        for name in a.get("required", []):
            sa, sb = pa.get(name), pb.get(name)
            if name in pb and (sb is False or (isinstance(sb, dict)
                                               and sb.get("not", 0) in _NOTHING)):
                return True
            if b_closed and name not in pb and self.gen_types(a) <= {"object"}:
                return True
            if isinstance(sa, dict) and isinstance(sb, dict) and self.excludes(sa, sb):
                if "$ref" not in sa and "allOf" not in sa:
                    return True
        return False

    def literals(self, s: dict, ptr: str) -> str:
        values = [s["const"]] if "const" in s else list(s["enum"])
        rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
        ok = [v for v in values if not any(True for _ in self.validator.descend(v, rest))]
        if not ok:
            raise _Unsat(f"no enum/const value satisfies the rest of the schema at '{ptr}'")
        texts = dict.fromkeys(json.dumps(v, separators=self.dump_separators, ensure_ascii=False)
                              for v in ok)
        return "(?:" + "|".join(rp.literal_regex(t) for t in texts) + ")"

    def any_value(self) -> str:
        ws = self.ws
        arr = rf"\[{ws}(?:{ANY_SCALAR}(?:{self.comma}{ANY_SCALAR})*)?{ws}\]"
        pair = rf"{rp.STRING}{self.colon}{ANY_SCALAR}"
        obj = rf"\{{{ws}(?:{pair}(?:{self.comma}{pair})*)?{ws}\}}"
        return f"(?:{ANY_SCALAR}|{arr}|{obj})"

    # ---------------------------------------------------------------------------- leaf types

    def t_null(self, s: dict, ptr: str) -> str:
        return rp.NULL

    def t_boolean(self, s: dict, ptr: str) -> str:
        return rp.BOOLEAN

    def t_integer(self, s: dict, ptr: str) -> str:
        m = s.get("multipleOf", s.get("divisibleBy"))
        if m is not None and not (_is_num(m) and float(m) == 1.0):
            raise _err("unsupported keyword 'multipleOf' (only 1 on integers)", f"{ptr}/multipleOf")
        if not _has(s, NUMBER_KW[:4]):
            return rp.INTEGER
        lo, hi = rp.integer_bounds(s, self.draft4)
        if lo is not None and hi is not None and lo > hi:
            raise _Unsat(f"empty integer range at '{ptr}'")
        return rp.int_range_regex(lo, hi)

    def t_number(self, s: dict, ptr: str) -> str:
        if "multipleOf" in s or "divisibleBy" in s:
            raise _err("unsupported keyword 'multipleOf' on numbers", f"{ptr}/multipleOf")
        if not _has(s, NUMBER_KW[:4]):
            return rp.NUMBER
        try:
            return rp.number_bounded_regex(s, self.draft4)
        except ValueError:
            raise _Unsat(f"empty number range at '{ptr}'") from None

    def t_string(self, s: dict, ptr: str) -> str:
        fmt = s.get("format")
        if fmt is not None and fmt not in rp.FORMATS and fmt in KNOWN_FORMATS:
            raise _err(f"unsupported keyword 'format' ({fmt!r})", f"{ptr}/format")
        fmt = fmt if fmt in rp.FORMATS else None
        present = [k for k in ("pattern", "minLength", "maxLength") if k in s]
        if fmt and present:
            raise _err(f"unsupported keyword '{present[0]}' next to 'format'",
                       f"{ptr}/{present[0]}")
        if fmt:
            return rp.FORMATS[fmt]
        if "pattern" in s:
            if len(present) > 1:
                raise _err(f"unsupported keyword '{present[1]}' next to 'pattern'",
                           f"{ptr}/{present[1]}")
            try:
                return rp.pattern_to_json_string_regex(s["pattern"])
            except ValueError as exc:
                raise _err(f"unsupported keyword 'pattern': {exc}", f"{ptr}/pattern") from None
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        if hi is not None and lo > hi:
            raise _Unsat(f"minLength > maxLength at '{ptr}'")
        if hi is None:
            return f'"{rp.STRING_CHAR}' + ("*" if lo == 0 else f"{{{lo},}}") + '"'
        # Counted: unescaped characters only (a subset; see regex_parts.PLAIN_CHAR).
        return f'"{rp.PLAIN_CHAR}{{{lo},{max(lo, min(int(hi), MAX_REPEAT))}}}"'

    # ------------------------------------------------------------------------ arrays, objects

    def t_array(self, s: dict, ptr: str) -> str:
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        hi = None if hi is None else int(hi)
        items = s.get("items", True)
        prefix = s.get("prefixItems") if self.draft2020 else (items if isinstance(items, list)
                                                               else None)
        if s.get("uniqueItems") is True:
            if lo >= 2:
                raise _err("unsupported keyword 'uniqueItems' (with minItems >= 2)",
                           f"{ptr}/uniqueItems")
            hi = 1 if hi is None else min(hi, 1)
        if hi is not None and lo > hi:
            raise _Unsat(f"minItems > maxItems at '{ptr}'")
        ws = self.ws
        if prefix is not None:  # a tuple: emit exactly len(prefix) items
            n = len(prefix)
            if n < lo or (hi is not None and n > hi):
                where = "prefixItems" if self.draft2020 else "items"
                raise _err(f"unsupported keyword '{where}' (tuple length outside "
                           "minItems..maxItems)", f"{ptr}/{where}")
            where = "prefixItems" if self.draft2020 else "items"
            parts = [self.node(p, f"{ptr}/{where}/{i}") for i, p in enumerate(prefix)]
            return rf"\[{ws}" + f"{self.comma}".join(parts) + rf"{ws}\]"
        if hi == 0:
            return rf"\[{ws}\]"
        try:
            elem = self.node(items, f"{ptr}/items")
        except self.droppable:
            if lo > 0:
                raise
            return rf"\[{ws}\]"
        if hi is not None:
            hi = max(lo, min(hi, MAX_REPEAT))
        more_lo = max(lo - 1, 0)
        more = "*" if hi is None and more_lo == 0 else (
            f"{{{more_lo},}}" if hi is None else f"{{{more_lo},{hi - 1}}}")
        body = f"{elem}(?:{self.comma}{elem}){more}"
        return rf"\[{ws}" + (body if lo > 0 else f"(?:{body})?") + rf"{ws}\]"

    def t_object(self, s: dict, ptr: str) -> str:
        props: dict[str, Any] = dict(s.get("properties", {}))
        required = [r for r in s.get("required", []) if isinstance(r, str)]
        extra = s.get("additionalProperties", True)
        patterns = s.get("patternProperties", {})
        for name in required:
            if name not in props:
                if extra is False and not any(_search(p, name, ptr) for p in patterns):
                    raise _Unsat(f"required '{name}' is not allowed at '{ptr}'")
                props[name] = extra if isinstance(extra, dict) else True
        for name in props:  # a declared name matching patternProperties must satisfy both
            for pat, sub in patterns.items():
                if _search(pat, name, f"{ptr}/patternProperties"):
                    props[name] = {"allOf": [props[name], sub]}
        required = self._dependencies(s, props, required, ptr)
        names = list(props)
        if "propertyNames" in s:
            for name in names:
                if any(True for _ in self.validator.descend(name, s["propertyNames"])):
                    if name in required:
                        raise _Unsat(f"required '{name}' fails propertyNames at '{ptr}'")
                    names.remove(name)
        for name in names:  # minProperties: promote optional properties to required
            if len(required) >= s.get("minProperties", 0):
                break
            if name not in required:
                required.append(name)
        items = []
        for name in names:
            try:
                value = self.node(props[name], f"{ptr}/properties/{_esc(name)}")
            except self.droppable:
                if name in required:
                    raise
                continue
            key = rp.literal_regex(json.dumps(name, ensure_ascii=False))
            items.append((f"{key}{self.colon}{value}", name in required))
        if len(required) > s.get("maxProperties", len(items) + len(required)):
            raise _Unsat(f"more required properties than maxProperties at '{ptr}'")
        while len(items) > s.get("maxProperties", len(items)):
            drop = max(i for i, (_, req) in enumerate(items) if not req)
            del items[drop]
        if len([1 for _, req in items if req]) < s.get("minProperties", 0):
            raise _Unsat(f"cannot reach minProperties at '{ptr}'")
        map_ok = (not props and not patterns and "propertyNames" not in s and extra is not False
                  and not s.get(_CLOSED))
        if map_ok and s.get("minProperties", 0) <= 1:
            return self._map(extra, s, ptr)
        return self._object_regex(items)

    def _dependencies(self, s: dict, props: dict, required: list[str], ptr: str) -> list[str]:
        """dependentRequired/dependentSchemas/dependencies: a trigger property that is
        required pulls its dependency in; an optional trigger is simply never emitted."""
        deps = dict(s.get("dependencies", {}))
        deps.update(s.get("dependentRequired", {}))
        deps.update(s.get("dependentSchemas", {}))
        required = list(required)
        for trigger, dep in deps.items():
            if trigger not in required:
                props.pop(trigger, None)
            elif isinstance(dep, list):
                required += [d for d in dep if d not in required]
            else:
                raise _err(f"unsupported schema dependency of required '{trigger}'",
                           f"{ptr}/dependencies")
        for name in required:
            if name not in props:
                raise _Unsat(f"required '{name}' is not emitted at '{ptr}'")
        return required

    def _object_regex(self, items: list[tuple[str, bool]]) -> str:
        """Closed object, keys in declared order, except that the first required property (if
        any) goes first so that every later one can carry a leading comma: linear size."""
        ws = self.ws
        first = next((i for i, (_, req) in enumerate(items) if req), None)
        if first is None:
            if not items:
                return rf"\{{{ws}\}}"
            head, rest = items[0][0], items[1:]
            tail = "".join(f"(?:{self.comma}{it})?" for it, _ in rest)
            return rf"\{{{ws}(?:{head}{tail})?{ws}\}}"
        head = items[first][0]
        rest = items[:first] + items[first + 1:]
        tail = "".join(f"{self.comma}{it}" if req else f"(?:{self.comma}{it})?" for it, req in rest)
        return rf"\{{{ws}{head}{tail}{ws}\}}"

    def _map(self, extra: Any, s: dict, ptr: str) -> str:
        """An object with no declared properties: string keys, values under
        additionalProperties. Duplicate keys collapse on parsing, so only the upper bound on
        the count is enforced by the regex."""
        ws = self.ws
        try:
            value = self.node(extra, f"{ptr}/additionalProperties")
        except self.droppable:
            if s.get("minProperties", 0) > 0:
                raise
            return rf"\{{{ws}\}}"
        pair = f'"{rp.STRING_CHAR}+"{self.colon}{value}'
        mx = s.get("maxProperties")
        if mx == 0:
            return rf"\{{{ws}\}}"
        more = "*" if mx is None else f"{{0,{min(int(mx), MAX_REPEAT) - 1}}}"
        body = f"{pair}(?:{self.comma}{pair}){more}"
        if s.get("minProperties", 0) == 0:
            body = f"(?:{body})?"
        return rf"\{{{ws}{body}{ws}\}}"


def _search(pattern: str, name: str, ptr: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as exc:
        raise _err(f"unsupported keyword 'patternProperties' ({pattern!r}: {exc})", ptr) from None


def _esc(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _has(s: dict, keys: tuple[str, ...]) -> bool:
    return any(k in s for k in keys)


def _types(t: Any) -> list[str]:
    return [t] if isinstance(t, str) else list(t)


def _infer_types(s: dict) -> list[str]:
    """Types to generate when ``type`` is absent: the one the keywords talk about (a sound
    subset), or every type (with scalar-only containers) when they say nothing."""
    for keys, types in ((OBJECT_KW, ["object"]), (ARRAY_KW, ["array"]),
                        (STRING_KW, ["string"]), (NUMBER_KW, ["number"])):
        if _has(s, keys):
            return types
    return list(ALL_TYPES)


def _value_set(s: dict) -> list | None:
    if "const" in s:
        return [s["const"]]
    return list(s["enum"]) if "enum" in s else None
