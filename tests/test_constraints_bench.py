"""Soundness over the JSONSchemaBench sample (all 200 schemas): for every schema we compile,
no schema-invalid test instance is accepted by the automaton and random walks validate under
``jsonschema`` (format checker on). Coverage must stay at or above 85%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixlm.constraints.schema import SchemaTranslator, check_schema
from radixlm.constraints.walk import byte_index, byte_random_walk, index_accepts

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"


@pytest.mark.skipif(not DATA.exists(), reason="JSONSchemaBench sample not present")
def test_jsonschemabench_sample_has_no_silent_violations():
    rows = [json.loads(line) for line in DATA.open()]
    compiled, violations, rejected = 0, [], {}
    for row in rows:
        schema = row["schema"]
        try:
            cls = check_schema(schema)
            index = byte_index(SchemaTranslator(schema, cls, r"[ ]?").translate())
        except ValueError as exc:
            rejected[row["unique_id"]] = str(exc)
            assert "JSON pointer" in str(exc) or "schema" in str(exc), exc
            continue
        compiled += 1
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        for test in row["tests"]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            if index_accepts(index, text.encode()) and not validator.is_valid(test["data"]):
                violations.append((row["unique_id"], "instance", text[:120]))
        for seed in range(2):
            out = byte_random_walk(index, seed)
            if out is not None and not validator.is_valid(json.loads(out.decode())):
                violations.append((row["unique_id"], "walk", out[:120]))
    assert not violations, violations
    assert compiled >= 0.85 * len(rows), (compiled, rejected)
