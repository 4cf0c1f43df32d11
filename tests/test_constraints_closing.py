"""The shortest-legal-close search (constraints/closing.py) on byte-level llguidance matchers:
every close it returns completes a document that parses and validates (jsonschema), and the
obvious closes are the shortest ones."""

import json
import random

import jsonschema
import llguidance as llg
import pytest

from radixlm.constraints import closing
from radixlm.constraints.schema.llg_rewrite import prepare_schema


def schema_matcher(schema: dict) -> llg.LLMatcher:
    grammar = llg.LLMatcher.grammar_from_json_schema(prepare_schema(schema), defaults={
        "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
        "lenient": False})
    return closing.byte_matcher(grammar)


PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "age": {"type": "integer"}}, "required": ["name", "tags", "age"]}

CASES = [
    (PERSON, b'{"name": "Ann", "tags": ["a", "b', b'"], "age": 0}'),
    (PERSON, b'{"name": "An', b'", "tags": [], "age": 0}'),
    (PERSON, b"", b'{"name": "", "tags": [], "age": 0}'),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, b"[", b"0, 0]"),
    ({"type": "string", "minLength": 3}, b'"x', b'00"'),
    ({"enum": ["CityJSON", "other"]}, b'"C', b'ityJSON"'),
]


@pytest.mark.parametrize("schema,prefix,expected", CASES)
def test_close_is_the_obvious_shortest(schema, prefix, expected):
    m = schema_matcher(schema)
    assert m.try_consume_tokens(list(prefix)) == len(prefix)
    close = closing.close_bytes(m)
    assert close is not None
    jsonschema.validate(json.loads(prefix + close), schema)
    assert len(close) <= len(expected)
    assert closing.close_bytes(m) == close


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"v": {"type": "string", "pattern": r"\d.\d"}},
     "required": ["v"]},
    {"type": "object", "required": ["mail"], "properties": {
        "mail": {"type": "string", "pattern": r"^[a-z]+@[a-z]+\.io$"}}},
])
def test_loops_in_patterns_are_left(schema):
    m = schema_matcher(schema)
    close = closing.close_bytes(m)
    assert close is not None
    jsonschema.validate(json.loads(close), schema)


def test_random_prefixes_close_to_valid_documents():
    rng = random.Random(7)
    schemas = [PERSON, {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["id", "ok"]}},
        "note": {"type": ["string", "null"]}}, "required": ["items"]}]
    for schema in schemas:
        for _ in range(30):
            m = schema_matcher(schema)
            prefix = bytearray()
            for _ in range(rng.randint(0, 60)):
                allowed = [b for b in closing.allowed_bytes(m).nonzero()[0] if 32 <= b < 127]
                if not allowed or m.is_accepting():
                    break
                b = int(rng.choice(allowed))
                assert m.try_consume_tokens([b]) == 1
                prefix.append(b)
            close = closing.close_bytes(m)
            assert close is not None, bytes(prefix)
            jsonschema.validate(json.loads(bytes(prefix) + close), schema)


def test_twin_follows_token_history():
    m = schema_matcher(PERSON)
    spell = {1: b'{"name": "A', 2: b"nn", 3: b'", "tags": ['}.get
    twin = closing.ByteTwin(m, spell)
    assert twin.sync([1, 2, 3])
    assert twin.close() == b'], "age": 0}'
    assert twin.sync([1])  # rolled back to the common prefix
    assert twin.close() == b'", "tags": [], "age": 0}'
    assert not twin.sync([1, 1])  # a byte the grammar refuses: the twin stays at [1]
    assert twin.fed == [1]
