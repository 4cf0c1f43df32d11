"""Repeated subschemas moved to ``$defs`` and referenced (constraints/schema/llg_share.py):
the grammar llguidance builds from the shared document accepts exactly what the unshared one
accepts (every test instance of the JSONSchemaBench sample, valid and invalid), and the walk
leaves alone what a reference could no longer find."""

import copy
import json
from pathlib import Path

import llguidance as llg
import pytest

from radixlm.constraints import closing
from radixlm.constraints.schema import llg_rewrite
from radixlm.constraints.schema.llg_share import share_repeats

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"
STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
         "lenient": False}
URI = {"type": "string", "format": "uri", "description": "a link"}


def refs(node) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if isinstance(node.get("$ref"), str) else []) + \
            [r for v in node.values() for r in refs(v)]
    return [r for v in node for r in refs(v)] if isinstance(node, list) else []


def byte_matcher(schema: dict) -> llg.LLMatcher | str:
    try:
        return closing.byte_matcher(llg.LLMatcher.grammar_from_json_schema(schema,
                                                                           defaults=STYLE))
    except ValueError as exc:
        return str(exc)


def accepts(template: llg.LLMatcher | str, text: str) -> bool | str:
    if isinstance(template, str):  # (the refusal)
        return template
    m, data = template.deep_copy(), text.encode()
    return m.try_consume_tokens(list(data)) == len(data) and m.is_accepting()


def test_a_repeated_subschema_is_one_definition_and_the_input_is_kept():
    schema = {"type": "object", "properties": {f"p{i}": dict(URI, title=f"link {i}")
                                               for i in range(5)},
              "$defs": {"radixlm-shared-0": {"type": "integer"}}}
    before = copy.deepcopy(schema)
    out = share_repeats(schema)
    assert schema == before  # (not mutated)
    new = [k for k in out["$defs"] if k not in schema["$defs"]]
    assert len(new) == 1 and new[0] != "radixlm-shared-0"  # (annotations aside, one name)
    assert out["$defs"][new[0]]["format"] == "uri"
    assert all(p == {"$ref": f"#/$defs/{new[0]}"} for p in out["properties"].values())
    assert out["$defs"]["radixlm-shared-0"] == {"type": "integer"}


def test_values_of_other_types_are_not_one_subschema():
    consts = [{"const": 1}, {"const": "1"}, {"const": True}, {"const": 1.0}, {"const": [1]}]
    schema = {"anyOf": [*consts, *consts]}
    out = share_repeats(schema)
    names = [r.split("/")[-1] for r in refs(out)]
    assert len(names) == 10 and len(set(names)) == 5
    assert sorted(json.dumps(out["$defs"][n]) for n in set(names)) == \
        sorted(json.dumps(c) for c in consts)


def test_what_a_pointer_names_or_passes_stays_in_place():
    inner = {"type": "object", "properties": {"u": URI, "n": {"type": "integer"}}}
    schema = {"type": "object", "properties": {
        "a": copy.deepcopy(inner), "b": copy.deepcopy(inner), "c": copy.deepcopy(inner),
        "to_a": {"$ref": "#/properties/a"},
        "to_bn": {"$ref": "#/properties/b/properties/n"}}}
    out = share_repeats(schema)
    props = out["properties"]
    assert "$ref" not in props["a"] and "$ref" not in props["b"]  # named / passed through
    assert props["b"]["properties"]["n"] == {"type": "integer"}  # named
    assert "$ref" in props["c"]  # nothing names it: the one definition
    assert props["to_a"] == {"$ref": "#/properties/a"}  # (a bare $ref is never moved)


def test_references_and_empty_schemas_stay_where_they_are():
    ref = {"$ref": "#/$defs/n", "description": "the same number"}
    schema = {"$defs": {"n": {"type": "integer"}}, "properties": {
        "a": dict(ref), "b": dict(ref), "c": {"title": "anything"}, "d": {}, "e": URI, "f": URI}}
    out = share_repeats(schema)
    props = out["properties"]
    assert props["a"] == props["b"] == ref and props["c"] == {"title": "anything"}
    assert props["d"] == {} and props["e"] == props["f"] == {"$ref": "#/$defs/radixlm-shared-0"}


@pytest.mark.parametrize("schema", [
    {"properties": {"a": {"$id": "http://x/a", "properties": {"u": URI, "v": URI}}}},
    {"properties": {"a": URI, "b": URI, "c": {"$ref": "other.json#/a"}}},
    {"properties": {"a": URI, "b": URI, "c": {"$ref": "#anchor"}}},
    {"properties": {"a": URI, "b": URI, "c": {"$dynamicRef": "#meta"}}},
    {"properties": {"a": {"id": "http://x/a", "properties": {"u": URI}}, "b": URI}},
    {"allOf": [URI, URI]},  # (allOf members are intersected in place: not walked)
    {"oneOf": [{"properties": {"k": {"const": 1}}}, {"properties": {"k": {"const": 1}}}]},
    {"properties": {"a": URI}, "$defs": ["not", "a map"]},
])
def test_documents_left_alone(schema):
    assert share_repeats(schema) is schema


def test_the_root_id_is_no_reason_to_leave_a_document():
    out = share_repeats({"$id": "https://example.com/s.json", "anyOf": [URI, URI]})
    assert refs(out) == ["#/$defs/radixlm-shared-0"] * 2


@pytest.mark.skipif(not DATA.exists(), reason="JSONSchemaBench sample not present")
def test_the_sample_accepts_the_same_instances_shared_or_not(monkeypatch):
    """Every test instance (valid and invalid ones) accepted by the shared grammar exactly
    when by the unshared one, and compile errors alike."""
    rows = [json.loads(line) for line in DATA.open()]
    shared = checked = 0
    for row in rows:
        schema = row["schema"] if isinstance(row["schema"], dict) else json.loads(row["schema"])
        with monkeypatch.context() as m:
            m.setattr(llg_rewrite, "share_repeats", lambda s: s)
            plain = llg_rewrite.prepare_schema(schema)
        together = llg_rewrite.prepare_schema(schema)
        if together is plain or together == plain:
            continue
        shared += 1
        matchers = [byte_matcher(s) for s in (plain, together)]
        for test in row["tests"]:
            text = json.dumps(test["data"], separators=(", ", ": "), ensure_ascii=False)
            verdicts = [accepts(m, text) for m in matchers]
            assert verdicts[0] == verdicts[1], (row["unique_id"], test["valid"], verdicts)
            checked += 1
    assert shared >= 120 and checked >= 500, (shared, checked)
