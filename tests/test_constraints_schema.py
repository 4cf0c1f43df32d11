"""JSON schema -> regex: every schema is either rejected by keyword + JSON pointer, or its
language (walked at byte level through the same outlines-core DFA) validates under
``jsonschema`` with the format checker on. No tokenizer needed."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import uuid

import jsonschema
import pytest
from constraint_walks import byte_random_walk, index_accepts
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.constraints import spec_from_sampling_params
from radixlm.constraints.outlines_index import byte_index
from radixlm.constraints.regex_parts import (
    int_range_regex,
    number_bounded_regex,
    pattern_to_json_string_regex,
)
from radixlm.constraints.schema.metaschema import check_schema, check_whitespace_pattern
from radixlm.constraints.schema.regex_translator import SchemaTranslator

SEEDS = range(6)


def translate(schema, ws=r"[ ]?", **kw) -> str:
    return SchemaTranslator(schema, check_schema(schema), ws, **kw).translate()


def walk_and_validate(schema, seeds=SEEDS, ws=r"[ ]?") -> list:
    """Random members of the schema's language; each must validate (formats asserted)."""
    index = byte_index(translate(schema, ws))
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    values = []
    for seed in seeds:
        out = byte_random_walk(index, seed)
        assert out is not None, f"walk {seed} did not finish"
        value = json.loads(out.decode("utf-8"))
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (out, errors)
        values.append(value)
    return values


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age"],
}

ACCEPTED = [  # (id, schema, an instance the compact regex must accept, or None)
    ("types", {"type": "object", "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
        "b": {"type": "boolean"}, "z": {"type": "null"}},
        "required": ["s", "i", "n", "b", "z"]},
     {"s": "x", "i": -3, "n": 1.5, "b": True, "z": None}),
    ("enum-const", {"type": "object", "properties": {
        "color": {"enum": ["red", "green", 3, None, {"a": [1]}]}, "v": {"const": "v1"}},
        "required": ["color", "v"]}, {"color": "red", "v": "v1"}),
    ("nested", {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}},
        "required": ["b"]}}, "required": ["a"]}, {"a": {"b": {"c": 1}}}),
    ("array-bounds", {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                      "maxItems": 4}, [1, 2, 3]),
    ("string-length", {"type": "string", "minLength": 2, "maxLength": 5}, "abc"),
    ("pattern", {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"}, "AB-123"),
    ("pattern-quotes", {"type": "string", "pattern": r'^a"b\\c$'}, 'a"b\\c'),
    ("pattern-search", {"type": "string", "pattern": "ab+"}, "abb"),
    ("date", {"type": "string", "format": "date"}, "2024-02-28"),
    ("date-time", {"type": "string", "format": "date-time"}, "2024-02-28T10:00:00Z"),
    ("uuid", {"type": "string", "format": "uuid"}, "12345678-1234-1234-1234-123456789abc"),
    ("email", {"type": "string", "format": "email"}, "a@b.co"),
    ("ipv4", {"type": "string", "format": "ipv4"}, "10.0.0.255"),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}, 5),
    ("oneOf-types", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, True),
    ("oneOf-tagged", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
         "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
         "required": ["kind"]}]}, {"kind": "b", "y": "q"}),
    ("oneOf-required", {"type": "object", "properties": {"p": {"type": "integer"},
                                                          "q": {"type": "integer"}},
                        "oneOf": [{"required": ["p"]}, {"required": ["q"]}]}, {"p": 1}),
    ("ref", {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}},
                              "required": ["x"]}},
             "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"},
                                              "b": {"$ref": "#/$defs/pt"}},
             "required": ["a", "b"]}, {"a": {"x": 1}, "b": {"x": 2.5}}),
    ("ref-recursive", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
        "$ref": "#/$defs/node"}, {"v": 1, "next": {"v": 2}}),
    ("required-optional", PERSON, {"name": "Al", "age": 30}),
    ("int-bounds", {"type": "integer", "minimum": -15, "exclusiveMaximum": 1000}, -15),
    ("int-bounds-draft4", {"$schema": "http://json-schema.org/draft-04/schema#",
                           "type": "integer", "minimum": 0, "exclusiveMinimum": True}, 1),
    ("number-bounds", {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, 0.5),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                          "required": ["a"]},
                         {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     {"a": 1, "b": "x"}),
    ("closed-allOf", {"allOf": [{"properties": {"a": {"type": "integer"}},
                                 "additionalProperties": False},
                                {"properties": {"b": {"type": "integer"}}}],
                      "type": "object"}, {"a": 1}),
    ("map", {"type": "object", "additionalProperties": {"type": "integer"},
             "maxProperties": 3}, {"k": 1}),
    ("unique-items", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [7]),
    ("type-list", {"type": ["string", "null"], "maxLength": 2}, None),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"},
                                                      {"type": "string"}]}, [1, "a"]),
    ("not-empty-prop", {"type": "object", "properties": {"a": {"not": {}},
                                                         "b": {"type": "integer"}}}, {"b": 1}),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"},
                                                            "b": {"type": "integer"}},
                           "required": ["a"], "dependentRequired": {"a": ["b"]}},
     {"a": 1, "b": 2}),
    ("empty", {}, 1),
]


@pytest.mark.parametrize("name,schema,instance", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_schema_walks_validate(name, schema, instance):
    walk_and_validate(schema)
    if instance is not None:
        text = json.dumps(instance, separators=(",", ":"))
        assert index_accepts(byte_index(translate(schema)), text.encode()), text


def test_formats_are_real_values():
    for v in walk_and_validate({"type": "string", "format": "date"}, range(20)):
        datetime.date.fromisoformat(v)
    for v in walk_and_validate({"type": "string", "format": "date-time"}, range(20)):
        datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
    for v in walk_and_validate({"type": "string", "format": "uuid"}, range(5)):
        uuid.UUID(v)
    for v in walk_and_validate({"type": "string", "format": "ipv4"}, range(20)):
        ipaddress.IPv4Address(v)


def test_required_properties_always_present_and_bounds_hold():
    for v in walk_and_validate(PERSON, range(20)):
        assert {"name", "age"} <= set(v) and 0 <= v["age"] <= 130


def test_recursive_ref_is_bounded():
    schema = ACCEPTED[[a[0] for a in ACCEPTED].index("ref-recursive")][1]
    deep = {"v": 1, "next": {"v": 2, "next": {"v": 3, "next": {"v": 4, "next": {"v": 5}}}}}
    index = byte_index(translate(schema, max_ref_depth=2))
    assert not index_accepts(index, json.dumps(deep, separators=(",", ":")).encode())
    assert index_accepts(index, b'{"v":1,"next":{"v":2}}')


REJECTED = [  # (schema, keyword named in the message, JSON pointer named in the message)
    ({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.5}}},
     "multipleOf", "/properties/x/multipleOf"),
    ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, "not",
     "/properties/x/not"),
    ({"type": "array", "contains": {"type": "integer"}}, "contains", "/contains"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if", "/if"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$",
                                             "maxLength": 3}}},
     "maxLength", "/properties/a/maxLength"),
    ({"type": "string", "pattern": "(?=a)ab"}, "pattern", "/pattern"),
    ({"type": "string", "format": "ipv6"}, "format", "/format"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "/oneOf"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2},
     "uniqueItems", "/uniqueItems"),
    ({"$ref": "other.json#/a"}, "$ref", "'/'"),
    ({"type": "object", "properties": {"p": {"unevaluatedProperties": False}}},
     "unevaluatedProperties", "/properties/p/unevaluatedProperties"),
]


@pytest.mark.parametrize("schema,keyword,pointer", REJECTED,
                         ids=[r[1] for r in REJECTED])
def test_unsupported_keywords_rejected_by_name_and_pointer(schema, keyword, pointer):
    with pytest.raises(ValueError) as exc:
        translate(schema)
    assert keyword in str(exc.value) and pointer in str(exc.value), str(exc.value)


def test_lenient_mode_prunes_optional_unsupported_parts():
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"not": {"type": "string"}}},
              "required": ["a"]}
    with pytest.raises(ValueError, match="'not'"):
        translate(schema)
    index = byte_index(translate(schema, strict=False))
    assert index_accepts(index, b'{"a":1}') and not index_accepts(index, b'{"a":1,"b":2}')
    with pytest.raises(ValueError, match="'not'"):  # required: still an error
        translate({**schema, "required": ["a", "b"]}, strict=False)


def test_invalid_schema_and_unsatisfiable_schema():
    with pytest.raises(ValueError, match="invalid JSON schema.*'/properties/a/type'"):
        translate({"type": "object", "properties": {"a": {"type": "strin"}}})
    with pytest.raises(ValueError, match="no value"):
        translate({"type": "integer", "minimum": 5, "maximum": 2})
    with pytest.raises(ValueError, match="no value"):
        translate({"type": "object", "properties": {"a": {"not": {}}}, "required": ["a"]})


def test_whitespace_pattern_is_checked_and_used():
    check_whitespace_pattern(r"[ \n]{0,2}")
    with pytest.raises(ValueError, match="whitespace_pattern"):
        check_whitespace_pattern(r"[ a]?")
    walk_and_validate(PERSON, ws=r"[ \n]{0,2}")
    assert index_accepts(byte_index(translate(PERSON, r"[ \n]{0,2}")),
                         b'{\n "name": "x",\n "age": 1\n}')


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.integers(-10**6, 10**6)),
       st.one_of(st.none(), st.integers(-10**6, 10**6)),
       st.lists(st.integers(-2 * 10**6, 2 * 10**6), max_size=30))
def test_int_range_regex_is_exact(lo, hi, probes):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    rx = re.compile(int_range_regex(lo, hi))
    for n in probes + [x for x in (lo, hi) if x is not None] + [0, -1, 1]:
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(rx.fullmatch(str(n))) == inside, (lo, hi, n)
    assert not rx.fullmatch("-0") and not rx.fullmatch("007")


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum"]),
                       st.integers(-50, 50) | st.floats(-50, 50).map(lambda x: round(x, 1)),
                       min_size=1),
       st.lists(st.from_regex(r"-?(0|[1-9][0-9]?)(\.[0-9]{1,3})?", fullmatch=True),
                min_size=20, max_size=40))
def test_number_bounds_regex_is_sound(bounds, probes):
    try:
        rx = re.compile(number_bounded_regex(bounds, draft4=False))
    except ValueError:
        return  # empty range
    for text in probes:
        if rx.fullmatch(text):
            jsonschema.validate(json.loads(text), {"type": "number", **bounds})


def test_pattern_translation_keeps_json_valid():
    rx = re.compile(pattern_to_json_string_regex(r'^[^@]+@[^"]+$'))
    assert rx.fullmatch('"a@b"') and not rx.fullmatch('"a"@b"')
    assert re.compile(pattern_to_json_string_regex(r"\d+")).fullmatch('"42"')
    assert not re.compile(pattern_to_json_string_regex(r"\d+")).fullmatch('"٤٢"')


def test_spec_from_sampling_params():
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str
        count: int

    spec = spec_from_sampling_params({"json_schema": Item})
    assert spec.kind == "json_schema" and json.loads(spec.value)["required"] == ["name", "count"]
    assert spec_from_sampling_params({"json_schema": '{"type": "integer"}'}).value == \
        '{"type":"integer"}'
    assert spec_from_sampling_params({"choices": ["a", "b"]}).value == ("a", "b")
    assert spec_from_sampling_params({"dtype": "int"}).value == "int"
    assert spec_from_sampling_params({"regex": "a+"}).kind == "regex"
    assert spec_from_sampling_params({"temperature": 0}) is None
    with pytest.raises(ValueError, match="at most one constraint.*regex.*choices"):
        spec_from_sampling_params({"regex": "a", "choices": ["a"]})
    with pytest.raises(ValueError, match="not valid JSON"):
        spec_from_sampling_params({"json_schema": "{nope"})
    with pytest.raises(ValueError, match="dtype"):
        spec_from_sampling_params({"dtype": "complex"})
    with pytest.raises(ValueError, match="choices"):
        spec_from_sampling_params({"choices": "ab"})
    with pytest.raises(ValueError, match="whitespace_pattern"):
        spec_from_sampling_params({"regex": "a", "whitespace_pattern": " "})


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):  # 2 levels of JSON each
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_a_schema_nested_past_the_limit_is_refused_by_name():
    """Past MAX_JSON_DEPTH a schema is a ValueError naming the limit wherever it enters
    (the schema walks are recursive; llguidance's JSON reader stops at the same depth), not
    a RecursionError; up to it, it loads."""
    from radixlm.constraints.specs import (
        MAX_JSON_DEPTH,
        load_json_schema,
        structural_tag_object,
    )

    fits = _nested((MAX_JSON_DEPTH - 1) // 2)  # 127 levels
    assert load_json_schema(fits) == fits == load_json_schema(json.dumps(fits))
    deep = _nested(MAX_JSON_DEPTH // 2)  # 129 levels
    with pytest.raises(ValueError, match="json_schema nests deeper than 128 levels"):
        load_json_schema(deep)
    text = '{"properties":{"a":' * 5000 + "{}" + "}}" * 5000  # past the JSON parser's own
    with pytest.raises(ValueError, match="json_schema nests deeper than 128 levels"):
        load_json_schema(text)
    with pytest.raises(ValueError, match="structural_tag nests deeper than 128 levels"):
        structural_tag_object({"triggers": ["<f>"], "structures": [
            {"begin": "<f>", "schema": deep, "end": "</f>"}]})
    with pytest.raises(ValueError, match="the schema nests deeper than 128 levels"):
        check_schema(_nested(3000))  # (tools' parameters: jsonschema's walk recurses)
