"""Schema-aware drafts for extraction: where a JSON document being written stands
(``JsonScan``), the schema along that path, and the values ``ValueLookup`` drafts from the
prompt's document (real tokenizer), alone and as the NGRAM drafter's source."""

from __future__ import annotations

import json

import pytest

from radixlm.radix import RadixCache
from radixlm.runtime.request import LogprobOptions, Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.speculative.json_scan import (
    NUMBER,
    START,
    STRING,
    JsonScan,
    schema_node,
)
from radixlm.runtime.speculative.ngram import NgramDrafter
from radixlm.runtime.speculative.text import text_codec
from radixlm.runtime.speculative.values import ValueLookup, key_words

DOC = ("The Old Mill Bridge was built in 1844 to carry farm carts across the Black Water. "
       "It weighs 1.2 kilograms, holds 28 liters and costs 79 dollars. A campaign "
       "collected 28,500 pounds. The crew works on Cedar Road near King Street.\n"
       "Next meeting: Monday 12 March at 10 a.m.\n")
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "year_built": {"type": "integer"},
    "river": {"type": "string"}, "weight_kg": {"type": "number"},
    "capacity_liters": {"type": "integer"}, "price_dollars": {"type": "integer"},
    "street": {"type": "string"}, "next_meeting": {"type": "string"},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
    "funds_raised": {"type": "string"}},
    "$defs": {"tag": {"type": "string"}}}


def scan(text: str):
    s = JsonScan()
    s.update(text)
    return s.context()


# ---------------------------------------------------------------------- the scan


def test_scan_tells_values_from_keys_and_punctuation() -> None:
    ctx = scan('{"name": "Old Mi')
    assert (ctx.kind, ctx.path, ctx.partial, ctx.key) == (STRING, ("name",), "Old Mi", "name")
    assert scan('{"na') is None and scan('{"name"') is None  # a key, then before its colon
    assert scan('{"name": "Ann",') is None  # punctuation: the next key is jump-forward's
    assert scan('{"age": ').kind == START
    ctx = scan('{"age": 18')
    assert (ctx.kind, ctx.partial) == (NUMBER, "18")
    assert scan('{"age": 18,') is None
    ctx = scan('{"a": {"b": ["x", "y\\"z')  # nested, in an array, an escaped quote
    assert (ctx.kind, ctx.path, ctx.partial, ctx.in_array, ctx.key) == (
        STRING, ("a", "b", "[]"), 'y"z', True, "b")
    assert scan('{"a": [').kind == START
    assert scan("Sure! Here") is None and scan('{"a": 1}}') is None  # not a document


def test_scan_is_incremental_and_rescans_after_a_rollback() -> None:
    s, text = JsonScan(), '{"name": "Ann", "tags": ["x", "yz'
    for i in range(1, len(text) + 1):  # a character at a time, as tokens arrive
        s.update(text[:i])
    assert s.context() == scan(text)
    s.update('{"name": "Bo')  # not an extension (jump-forward retokenized): a rescan
    assert s.context() == scan('{"name": "Bo')
    a, b = scan('{"t": ["x", "'), scan('{"t": ["xy", "')
    assert a.path == b.path and a.start != b.start  # two items told apart by their start


def test_schema_node_walks_properties_items_and_refs() -> None:
    assert schema_node(SCHEMA, ("name",)) == ({"type": "string"}, False)
    assert schema_node(SCHEMA, ("funds_raised",)) == ({"type": "string"}, True)  # last key
    assert schema_node(SCHEMA, ("tags", "[]")) == ({"type": "string"}, False)  # via $ref
    assert schema_node(SCHEMA, ("nope",)) == ({}, False)
    assert schema_node(None, ("name",)) == ({}, False)
    assert key_words("closed_to_cars_year") == ["closed", "cars", "year"]
    assert key_words("contactName") == ["contact", "name"] and key_words("id") == []


# ---------------------------------------------------------------------- the values


@pytest.fixture
def lookup(tokenizer):
    """A prompt that quotes the schema (whose keys and numbers must not be taken for the
    document's), then the document; returns (ValueLookup factory, prompt ids, tokenizer)."""
    text = (f"Extract the details as JSON that follows this schema:\n{json.dumps(SCHEMA)}"
            f"\n\nText:\n{DOC}")
    prompt = tokenizer.encode(text, add_special_tokens=False)

    def draft(output: str, k: int = 16) -> str:
        vl = ValueLookup(text_codec(tokenizer), len(prompt), json.dumps(SCHEMA))
        out = tokenizer.encode(output, add_special_tokens=False)
        return tokenizer.decode(vl.propose(prompt + out, k))

    return draft


def test_a_copied_string_value_is_drafted_to_its_end_and_closing_quote(lookup) -> None:
    assert lookup('{"name": "Old') == ' Mill Bridge",'  # a name ends at a lowercase word
    assert lookup('{"river": "Black') == ' Water",'  # ... or at the sentence's end
    assert lookup('{"funds_raised": "28,5') == '00 pounds"}'  # a unit; the last key: "}
    assert lookup('{"street": "Cedar Road') == '",'  # complete: only the closing
    assert lookup('{"tags": ["Old Mill', 3) == ' Bridge",'  # an item; k bounds the draft
    assert lookup('{"river": "Nowhere') == ""  # not in the document


def test_a_value_is_found_from_its_key_before_it_starts(lookup) -> None:
    assert lookup('{"weight_kg": ') == "1.2,"  # the number by the key's words
    assert lookup('{"capacity_liters": ') == "28,"  # a unit after the number
    assert lookup('{"price_dollars": ') == "79,"  # not the schema's own text's numbers
    assert lookup('{"year_built": 18') == "44,"  # the rest of the number
    assert lookup('{"year_built": 19') == ""  # it no longer agrees
    assert lookup('{"street": "') == 'King Street",'  # a capitalized phrase with a key word
    assert lookup('{"next_meeting": "') == 'Monday 12 March at 10 a.m.",'  # a label
    assert lookup('{"name": "') == 'Old Mill Bridge",'  # a first *name: the first name
    assert lookup('{"river": "') == ""  # no guess: other sources may try


def test_the_drafter_asks_values_first_under_a_schema(tokenizer) -> None:
    prompt = tokenizer.encode(f"Extract as JSON.\n\nText:\n{DOC}", add_special_tokens=False)
    params = SamplingParams.from_dict({"max_new_tokens": 200,
                                       "json_schema": json.dumps(SCHEMA)})
    req = Req(rid="r", input_ids=prompt, params=params, logprob=LogprobOptions(), detok=None,
              sink=None)
    req.output_ids = tokenizer.encode('{"name": "Old', add_special_tokens=False)
    drafter = NgramDrafter(RadixCache(lambda slots: None), max_draft_tokens=8,
                           tokenizer=tokenizer)
    assert tokenizer.decode(drafter.propose(req, 8)) == ' Mill Bridge",'
    assert drafter.stats["value_drafts"] == 1 and drafter.stats["text_drafts"] == 0
    drafter.observe(req, 3, 3)
    assert drafter.stats["value_accepted_tokens"] == 3
    req.output_ids = tokenizer.encode('{"name": "Zq', add_special_tokens=False)
    drafter.propose(req, 8)  # in a value without a guess: token lookup may, text may not
    assert drafter.stats["text_drafts"] == 0
    req.output_ids = tokenizer.encode('{"name": "Old', add_special_tokens=False)
    rate = drafter.expected_rate(req)  # a value draft is ready: the value source's record
    assert rate is not None and 0.75 < rate <= 1.0
    assert tokenizer.decode(drafter.propose(req, 2)) == " Mill Bridge"  # the ready one, cut
    req.output_ids = tokenizer.encode('{"name": "Zq', add_special_tokens=False)
    assert drafter.expected_rate(req) is None  # no guess: the scheduler's own rate
    plain = Req(rid="p", input_ids=prompt, params=SamplingParams.from_dict(
        {"max_new_tokens": 200}), logprob=LogprobOptions(), detok=None, sink=None)
    plain.output_ids = list(req.output_ids)
    drafter.propose(plain, 8)  # no schema: no value source
    assert drafter._states[plain.uid].values is None and drafter.expected_rate(plain) is None


def test_token_lookup_opens_a_value_only_from_the_same_keys_end(tokenizer) -> None:
    """At a value's opening quote, the last tokens ``": "`` alone point at the previous
    value, rarely this one's: prompt lookup drafts there only from a longer match."""
    prompt = tokenizer.encode("Extract as JSON.\n\nText:\nA note.", add_special_tokens=False)
    params = SamplingParams.from_dict({"max_new_tokens": 200, "json_schema": "{}"})
    req = Req(rid="r", input_ids=prompt, params=params, logprob=LogprobOptions(), detok=None,
              sink=None)
    drafter = NgramDrafter(RadixCache(lambda slots: None), max_draft_tokens=8,
                           tokenizer=tokenizer)
    req.output_ids = tokenizer.encode('{"name": "Zed Qux", "river": "', add_special_tokens=False)
    assert drafter.propose(req, 8) == []
    req.output_ids = tokenizer.encode('{"start_date": "2022-01", "end_date": "',
                                      add_special_tokens=False)
    assert tokenizer.decode(drafter.propose(req, 4)).startswith("20")
