"""``oneOf`` for the regex translator: an alternation is sound only if no value generated for
one branch is valid under another. The proofs here are about what the translator
*generates* (closed objects, the types ``infer_types`` picks), which is narrower than
``analysis.disjoint`` (no value valid under both), and they ask the validator about finite
value sets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.constraints.schema.analysis import (
    ALL_TYPES,
    ANY_VALUE,
    json_type,
    type_names,
    value_set,
)
from radixlm.constraints.schema.regex_keywords import CLOSED, infer_types, reject


def _generated_type(v: Any) -> str:
    """A value's JSON type, integral numbers as "integer" (``gen_types`` adds "number")."""
    t = json_type(v)
    return "integer" if t == "number" and (isinstance(v, int) or v == int(v)) else t


class OneOfNarrowing:
    """Proofs that ``oneOf`` branches don't overlap in what is generated for them, and the
    narrowing of a branch that makes them so. ``lookup(ref, ptr)`` resolves a local
    ``$ref``; ``ref_siblings``: keywords beside ``$ref`` apply (2019-09 and later)."""

    def __init__(self, validator: Any, lookup: Callable[[str, str], Any], ref_siblings: bool):
        self.validator = validator
        self.lookup = lookup
        self.ref_siblings = ref_siblings

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
                    out[i] = {**a, "properties": props, CLOSED: True}
                    continue
                pa, pb = a.get("properties", {}), b.get("properties", {})
                tags = [q for q in pa if isinstance(pa[q], dict) and isinstance(pb.get(q), dict)
                        and "$ref" not in pa[q] and self.excludes(pa[q], pb[q])]
                if tags and gen <= {"object"}:  # make a discriminating property required
                    out[i] = {**a, "required": list(a.get("required", [])) + tags[:1]}
                    continue
                if "type" in b and "enum" not in a and "const" not in a:
                    bt = set(type_names(b["type"]))
                    bt |= {"integer", "number"} if bt & {"integer", "number"} else set()
                    keep = [t for t in ALL_TYPES if t in gen - bt]
                    if keep and (gen - bt) != gen:
                        out[i] = {**a, "type": keep}
                        continue
                raise reject(f"unsupported 'oneOf': branches {i} and {j} may overlap", ptr)
        return out

    def gen_types(self, s: Any, depth: int = 0) -> set[str]:
        """JSON types of the values we may generate for ``s`` (integer implies number)."""
        if s is True or depth > 8:
            return set(ALL_TYPES)
        if s is False:
            return set()
        if "$ref" in s and not self.ref_siblings:
            return self.gen_types(self.lookup(s["$ref"], ""), depth + 1)
        vals = value_set(s, lenient=True)
        if vals is not None:
            out = {_generated_type(v) for v in vals}
        elif "type" in s:
            out = set(type_names(s["type"]))
        elif "$ref" in s:
            return self.gen_types(self.lookup(s["$ref"], ""), depth + 1)
        elif "anyOf" in s or "oneOf" in s:
            out = set()
            for b in s.get("anyOf", s.get("oneOf")):
                out |= self.gen_types(b, depth + 1)
        else:
            out = set(infer_types(s))
        return out | ({"number"} if "integer" in out else set())

    def excludes(self, a: dict, b: dict) -> bool:
        """True if no value generated for ``a`` can be valid under ``b``."""
        va = value_set(a, lenient=True)
        if va is not None:  # finite: ask the validator directly
            return all(any(True for _ in self.validator.descend(v, b)) for v in va)
        if "type" in b:
            allowed = set(type_names(b["type"]))
            if "number" in allowed:
                allowed.add("integer")
            if not (self.gen_types(a) & allowed):
                return True
        pa, pb = a.get("properties", {}), b.get("properties", {})
        b_closed = b.get("additionalProperties", True) is False and "patternProperties" not in b
        for name in a.get("required", []):
            sa, sb = pa.get(name), pb.get(name)
            if name in pb and (sb is False or (isinstance(sb, dict)
                                               and sb.get("not", 0) in ANY_VALUE)):
                return True
            if b_closed and name not in pb and self.gen_types(a) <= {"object"}:
                return True
            if isinstance(sa, dict) and isinstance(sb, dict) and self.excludes(sa, sb):
                if "$ref" not in sa and "allOf" not in sa:
                    return True
        return False
