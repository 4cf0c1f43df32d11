"""One JSON-schema conformance suite over both grammar backends, on the JSONSchemaBench sample
in shared/data: every compiled schema accepts no schema-invalid test instance and every
random walk through the grammar validates under ``jsonschema`` (format checker on); coverage
and completeness (valid instances accepted) stay at or above the measured floors. Rejections
name a keyword or the schema problem. See ``benchmarks/constraint_conformance.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from constraint_conformance import check_row, llguidance_checker, outlines_checker

from radixlm.constraints import create_grammar_backend

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"
# backend -> (min schemas compiled of 200, min share of valid instances accepted)
FLOORS = {"llguidance": (194, 0.8), "outlines": (170, 0.3)}


@pytest.fixture(scope="module")
def ll_backend(tokenizer):
    be = create_grammar_backend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield be
    be.shutdown()


@pytest.mark.skipif(not DATA.exists(), reason="JSONSchemaBench sample not present")
@pytest.mark.parametrize("name", ["llguidance", "outlines"])
def test_jsonschemabench_sample_conformance(name, ll_backend):
    rows = [json.loads(line) for line in DATA.open()]
    make = (lambda s: llguidance_checker(ll_backend, s)) if name == "llguidance" \
        else outlines_checker
    results = [check_row(row, make, walks=1) for row in rows]
    violations = [(r["id"], r["violation_examples"]) for r in results
                  if r.get("violation_examples")]
    assert not violations, violations[:5]
    compiled = [r for r in results if r["compiled"]]
    for r in results:
        if not r["compiled"]:
            assert any(w in r["message"] for w in ("schema", "keyword", "JSON pointer")), r
    valid = sum(r.get("valid", 0) for r in compiled)
    accepted = sum(r.get("valid_accepted", 0) for r in compiled)
    invalid = sum(r.get("invalid", 0) for r in compiled)
    walks = sum(r.get("walks", 0) for r in compiled)
    min_compiled, min_complete = FLOORS[name]
    assert len(compiled) >= min_compiled, (name, len(compiled))
    print(name, "compiled", len(compiled), "valid accepted", accepted, "of", valid)
    assert accepted >= min_complete * valid, (name, accepted, valid)
    assert invalid > 300 and walks >= 0.9 * len(compiled)  # the checks really ran
