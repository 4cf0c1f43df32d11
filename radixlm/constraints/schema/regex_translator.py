"""JSON Schema -> regex (the outlines backend's language), sound by construction: every
string the regex matches parses as JSON and validates against the schema (checked by
``jsonschema`` in the tests). Completeness is not promised: where the exact language is out
of reach we generate a subset (objects are closed, properties come in declared order,
``uniqueItems`` arrays hold at most one item, long repeats are capped) or reject the schema
with a ``ValueError`` naming the keyword and its JSON pointer.

Why not ``outlines_core.json_schema.build_regex_from_schema``: in 0.2.14 it silently drops
keywords (minimum/maximum, pattern next to minLength, allOf concatenates branch regexes,
oneOf acts as anyOf) and emits ``pattern`` and some formats raw inside a JSON string (a
``"`` in the pattern breaks the JSON). We walk the schema with an allow-list instead and use
the building blocks in ``regex_parts``; the token-level index is still outlines-core's.

This module is the walk (``$ref``/``allOf`` inlining, alternatives, arrays, objects);
``regex_keywords`` holds the keyword merge and the scalar regexes, ``regex_oneof`` the
``oneOf`` proofs.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constraints import regex_parts as rp
from radixlm.constraints.schema.analysis import (
    ALL_TYPES,
    ANY_VALUE,
    ASSERTION_KEYWORDS,
    pointer_target,
    type_names,
    value_set,
)
from radixlm.constraints.schema.regex_keywords import (
    CLOSED,
    MAX_REPEAT,
    Reject,
    TooDeep,
    Unsat,
    infer_types,
    merge,
    reject,
    scalar_regex,
    search,
)
from radixlm.constraints.schema.regex_oneof import OneOfNarrowing
from radixlm.constraints.specs import DEFAULT_SEPARATORS

# The ones this translator enforces exactly (or by a sound restriction, see module doc).
ENFORCED_KEYWORDS = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern items additionalItems prefixItems maxItems minItems uniqueItems "
    "maxProperties minProperties required properties patternProperties additionalProperties "
    "dependencies dependentRequired dependentSchemas propertyNames allOf anyOf oneOf $ref "
    "format".split()
)
ANY_SCALAR = f"(?:{rp.STRING}|{rp.NUMBER}|{rp.BOOLEAN}|{rp.NULL})"


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
        self.droppable: tuple[type, ...] = (Unsat, TooDeep) + (() if strict else (Reject,))
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
        self.one_of = OneOfNarrowing(self.validator, self.lookup, self.ref_siblings)
        self.ref_stack: list[str] = []
        self.memo: dict[tuple, str | Exception] = {}
        self.work = 0  # characters of regex built so far, kept or not

    def translate(self) -> str:
        try:
            return self.node(self.root, "")
        except Unsat as exc:
            raise ValueError(f"schema admits no value this backend can generate: {exc}") from None
        except TooDeep as exc:
            raise ValueError(
                f"schema too large: recursive $ref deeper than {self.max_ref_depth} levels or "
                f"regex over {self.max_regex_chars} characters, with no optional way out: {exc}"
            ) from None

    # ----------------------------------------------------------------------------- structure

    def node(self, s: Any, ptr: str) -> str:
        if s is True:
            return self.any_value()
        if s is False or (isinstance(s, dict) and s.get("not", 0) in ANY_VALUE):
            raise Unsat(f"'false' schema at '{ptr}'")
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
                raise TooDeep(f"regex over {self.max_regex_chars} characters at '{ptr}'")
            self.memo[key] = out
            return out
        except (Unsat, TooDeep, Reject) as exc:
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
                    raise TooDeep(f"'{ref}' at '{ptr}'")
                self.ref_stack.append(ref)
                pushed += 1
                target = self.lookup(ref, ptr)
                if target is False:
                    raise Unsat(f"$ref to 'false' at '{ptr}'")
                rest = {k: v for k, v in s.items() if k != "$ref" and self.ref_siblings}
                s = merge(rest, {} if target is True else target, ptr)
            else:
                rest = {k: v for k, v in s.items() if k != "allOf"}
                for i, sub in enumerate(s["allOf"]):
                    if sub is False:
                        raise Unsat(f"'false' in allOf at '{ptr}/allOf/{i}'")
                    if sub is not True:
                        sub, n = self.resolve(sub, f"{ptr}/allOf/{i}")
                        pushed += n
                        rest = merge(rest, sub, f"{ptr}/allOf/{i}")
                s = rest
        return s, pushed

    def lookup(self, ref: str, ptr: str) -> Any:
        if not ref.startswith("#"):
            raise reject(f"unsupported keyword '$ref' (only local references, got {ref!r})", ptr)
        try:
            return pointer_target(self.root, ref)
        except KeyError:
            raise reject(f"unresolvable '$ref' {ref!r}", ptr) from None

    def _node(self, s: dict, ptr: str) -> str:
        for k in s:
            if k in ASSERTION_KEYWORDS and k not in ENFORCED_KEYWORDS:
                raise reject(f"unsupported JSON-schema keyword '{k}'", f"{ptr}/{k}")
        if "anyOf" in s or "oneOf" in s:
            return self.alternatives(s, ptr)
        if "enum" in s or "const" in s:
            return self.literals(s, ptr)
        types = type_names(s["type"]) if "type" in s else infer_types(s)
        alts = []
        for t in types:
            if t not in ALL_TYPES:
                raise reject(f"unsupported type {t!r}", f"{ptr}/type")
            try:
                alts.append(self.t_array(s, ptr) if t == "array" else self.t_object(s, ptr)
                            if t == "object" else scalar_regex(t, s, ptr, self.draft4))
            except self.droppable:
                if len(types) == 1:
                    raise
        if not alts:
            raise Unsat(f"no type of {types} admits a value at '{ptr}'")
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
                merged, _ = self.resolve(merge(rest, {} if b is True else b, sub_ptr),
                                         sub_ptr)
            except self.droppable:
                continue
            finally:
                refs = self.ref_stack[depth:]
                del self.ref_stack[depth:]
            branches.append((merged, sub_ptr, refs))
        if key == "oneOf":
            merged = self.one_of.make_disjoint([b[0] for b in branches], f"{ptr}/oneOf")
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
            raise Unsat(f"no branch of '{key}' at '{ptr}' admits a value")
        return "(?:" + "|".join(alts) + ")"

    def literals(self, s: dict, ptr: str) -> str:
        values = value_set(s, lenient=True)
        rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
        ok = [v for v in values if not any(True for _ in self.validator.descend(v, rest))]
        if not ok:
            raise Unsat(f"no enum/const value satisfies the rest of the schema at '{ptr}'")
        texts = dict.fromkeys(json.dumps(v, separators=self.dump_separators, ensure_ascii=False)
                              for v in ok)
        return "(?:" + "|".join(rp.literal_regex(t) for t in texts) + ")"

    def any_value(self) -> str:
        ws = self.ws
        arr = rf"\[{ws}(?:{ANY_SCALAR}(?:{self.comma}{ANY_SCALAR})*)?{ws}\]"
        pair = rf"{rp.STRING}{self.colon}{ANY_SCALAR}"
        obj = rf"\{{{ws}(?:{pair}(?:{self.comma}{pair})*)?{ws}\}}"
        return f"(?:{ANY_SCALAR}|{arr}|{obj})"

    # ------------------------------------------------------------------------ arrays, objects

    def t_array(self, s: dict, ptr: str) -> str:
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        hi = None if hi is None else int(hi)
        items = s.get("items", True)
        prefix = s.get("prefixItems") if self.draft2020 else (items if isinstance(items, list)
                                                               else None)
        if s.get("uniqueItems") is True:
            if lo >= 2:
                raise reject("unsupported keyword 'uniqueItems' (with minItems >= 2)",
                           f"{ptr}/uniqueItems")
            hi = 1 if hi is None else min(hi, 1)
        if hi is not None and lo > hi:
            raise Unsat(f"minItems > maxItems at '{ptr}'")
        ws = self.ws
        if prefix is not None:  # a tuple: emit exactly len(prefix) items
            n = len(prefix)
            if n < lo or (hi is not None and n > hi):
                where = "prefixItems" if self.draft2020 else "items"
                raise reject(f"unsupported keyword '{where}' (tuple length outside "
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
                if extra is False and not any(search(p, name, ptr) for p in patterns):
                    raise Unsat(f"required '{name}' is not allowed at '{ptr}'")
                props[name] = extra if isinstance(extra, dict) else True
        for name in props:  # a declared name matching patternProperties must satisfy both
            for pat, sub in patterns.items():
                if search(pat, name, f"{ptr}/patternProperties"):
                    props[name] = {"allOf": [props[name], sub]}
        required = self._dependencies(s, props, required, ptr)
        names = list(props)
        if "propertyNames" in s:
            for name in names:
                if any(True for _ in self.validator.descend(name, s["propertyNames"])):
                    if name in required:
                        raise Unsat(f"required '{name}' fails propertyNames at '{ptr}'")
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
            raise Unsat(f"more required properties than maxProperties at '{ptr}'")
        while len(items) > s.get("maxProperties", len(items)):
            drop = max(i for i, (_, req) in enumerate(items) if not req)
            del items[drop]
        if len([1 for _, req in items if req]) < s.get("minProperties", 0):
            raise Unsat(f"cannot reach minProperties at '{ptr}'")
        map_ok = (not props and not patterns and "propertyNames" not in s and extra is not False
                  and not s.get(CLOSED))
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
                raise reject(f"unsupported schema dependency of required '{trigger}'",
                           f"{ptr}/dependencies")
        for name in required:
            if name not in props:
                raise Unsat(f"required '{name}' is not emitted at '{ptr}'")
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


def _esc(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
