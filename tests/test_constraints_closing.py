"""The shortest-legal-close search (constraints/closing.py) on byte-level llguidance matchers:
every close it returns completes a document that parses and validates (jsonschema), and the
obvious closes are the shortest ones."""

import json
import random

import jsonschema
import llguidance as llg
import numpy as np
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


@pytest.mark.parametrize("pattern,sample", [
    (r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}\w*", "0000-00-00T00-00-00-000"),
    (r"\d+\.\d+\.\d+-?.*", "0.0.0"),
    (r"^mqtt:connect$|^mqtt:subscribe$", "mqtt:connect"),
    (r"^[^\\.\\$# ]+$", "a"),
    (r"(a)\1", None),  # back references are not sampled
])
def test_pattern_samples_match_their_pattern(pattern, sample):
    assert closing.pattern_sample(pattern) == sample


def test_a_string_under_an_unanchored_pattern_is_ended_by_the_hints():
    """The mask inside the string stays "any character" until the pattern matched: only the
    pattern's sample (a hint) gets the greedy pass out."""
    schema = {"type": "object", "required": ["at", "v"], "properties": {
        "at": {"type": "string", "pattern": r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{3}"},
        "v": {"type": "string", "pattern": "1.2"}}}
    grammar = llg.LLMatcher.grammar_from_json_schema(prepare_schema(schema), defaults={
        "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
        "lenient": False})
    hints = closing.grammar_hints(grammar)
    assert hints == (b"1a2", b"0000-00-00T00-00-000")
    m = closing.byte_matcher(grammar)
    assert closing.greedy_close(m) is None  # (without the hints: lost in the loop)
    for prefix in (b"", b'{"at": "x', b'{"at": "0000-00-00T00-00-000", "v": "2'):
        assert m.try_consume_tokens(list(prefix)) == len(prefix)
        close = closing.close_bytes(m, hints)
        assert close is not None and len(close) < 80, close
        jsonschema.validate(json.loads(prefix + close), schema)
        if prefix:
            m.rollback(len(prefix))


def test_a_long_start_close_is_found_once_past_the_usual_bound():
    keys = [f"key_number_{i:03d}" for i in range(120)]  # ~2.8 KB of required keys
    schema = {"type": "object", "required": keys,
              "properties": {k: {"type": "boolean"} for k in keys}}
    m = schema_matcher(schema)
    assert closing.close_bytes(m) is None
    close = closing.close_bytes(m, long=True)
    assert close is not None and len(close) > closing.MAX_GREEDY_BYTES
    jsonschema.validate(json.loads(close), schema)


def test_vocab_spells_with_the_longest_token_the_mask_allows():
    from radixlm.constraints.vocab import TokenVocab

    vocab = TokenVocab({0: b"a", 1: b"b", 2: b"ab", 3: b"abc"}, frozenset(), "h")

    def row(*ids):
        return np.array([sum(1 << i for i in ids)], dtype=np.int64).astype(np.int32)

    assert vocab.spell(b"abab", lambda: row(0, 1, 2), lambda t: False) is None  # refused
    assert vocab.spell(b"abab", lambda: row(0, 1, 2), lambda t: True) == [2, 2]
    assert vocab.spell(b"abab", lambda: row(0, 1), lambda t: True) == [0, 1, 0, 1]
    assert vocab.spell(b"abc", lambda: row(0, 1), lambda t: True) is None  # no "c" allowed
