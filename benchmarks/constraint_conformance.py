"""JSON-schema conformance of a grammar backend on JSONSchemaBench rows (shared by the test
suite and ``bench_schema_coverage.py``).

For one schema: compile it (or record why not), check every test instance serialized
compactly (a schema-invalid instance the grammar accepts is a *silent violation*; a valid one
it rejects is a completeness miss, allowed: both backends generate a sound subset, e.g.
closed objects), and validate random walks through the grammar with ``jsonschema`` (format
checker on; a walk that fails is a silent violation too).

Backends are checked on the language they decode with: llguidance through its real token
matcher on the model's tokenizer; outlines-core through a byte-level index of the same regex
(identical language, ~100x faster to build than the token index).
"""

from __future__ import annotations

import collections
import json
import re
import time
from collections.abc import Callable
from typing import Any

import jsonschema
from constraint_walks import accepts_text, byte_random_walk, index_accepts, random_walk

from radixlm.constraints.outlines_index import byte_index
from radixlm.constraints.schema.metaschema import check_schema
from radixlm.constraints.schema.regex_translator import SchemaTranslator
from radixlm.constraints.specs import ConstraintSpec

WHITESPACE = r"[ ]?"


class Checker:
    """``accepts(text)`` and ``walk(seed) -> text | None`` for one compiled schema."""

    def __init__(self, accepts: Callable[[str], bool], walk: Callable[[int], str | None],
                 mask_times: list[float] | None = None):
        self.accepts = accepts
        self.walk = walk
        self.mask_times = mask_times if mask_times is not None else []


def outlines_checker(schema: Any) -> Checker:
    """The outlines backend's language (schema -> regex translator, byte-level index)."""
    cls = check_schema(schema)
    index = byte_index(SchemaTranslator(schema, cls, WHITESPACE).translate())

    def walk(seed: int) -> str | None:
        out = byte_random_walk(index, seed)
        return None if out is None else out.decode("utf-8", "replace")

    return Checker(lambda text: index_accepts(index, text.encode("utf-8")), walk)


def llguidance_checker(backend, schema: Any) -> Checker:
    """The llguidance backend's language, through its token matcher."""
    spec = ConstraintSpec("json_schema", json.dumps(schema), WHITESPACE)
    backend.validate(spec)
    grammar = backend.compile_async(spec).result(timeout=60)
    tok = backend.tokenizer
    times: list[float] = []

    class Timed:  # the walk's mask fills, timed
        def __init__(self, g):
            self.g = g

        def fill_bitmask(self, mask, row):
            t0 = time.perf_counter()
            self.g.fill_bitmask(mask, row)
            times.append(time.perf_counter() - t0)

        def __getattr__(self, name):
            return getattr(self.g, name)

    def walk(seed: int) -> str | None:
        out, done, _ = random_walk(Timed(grammar.copy()), tok, backend.words, backend.eos_ids,
                                   seed, explore_steps=20, max_steps=300)
        return tok.decode(out) if done else None

    return Checker(lambda text: accepts_text(grammar, tok, text), walk, times)


def reason(msg: str) -> str:
    """A short rejection category: the message up to the pointer, details dropped."""
    msg = re.sub(r" at JSON pointer.*", "", msg.splitlines()[0] if msg else msg)
    return re.sub(r"\(.*|: .*|'[^']*/[^']*'", "", msg).strip()[:60]


def check_row(row: dict, make: Callable[[Any], Checker], walks: int) -> dict:
    """Compile one JSONSchemaBench row's schema with ``make`` and check it (see module doc)."""
    schema = row["schema"]
    res: dict[str, Any] = {"id": row["unique_id"], "subset": row["subset"], "compiled": False}
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        checker = make(schema)
    except ValueError as exc:
        res["reason"] = reason(str(exc))
        res["message"] = str(exc)[:150]
        return res
    res["compile_s"] = time.perf_counter() - t0
    # CPU seconds of the whole process (all threads): the work, without the time a loaded
    # machine keeps the process waiting
    res["compile_cpu_s"] = time.process_time() - c0
    res["compiled"] = True
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    counts: collections.Counter = collections.Counter()
    examples = []
    for test in row["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
        accepted = checker.accepts(text)
        valid = validator.is_valid(test["data"])
        counts["valid" if valid else "invalid"] += 1
        counts["valid_accepted"] += valid and accepted
        counts["invalid_rejected"] += not valid and not accepted
        if accepted and not valid:
            counts["violations"] += 1
            examples.append(("instance", text[:200]))
    for seed in range(walks):
        out = checker.walk(seed)
        if out is None:
            counts["walks_unfinished"] += 1
            continue
        counts["walks"] += 1
        try:
            ok = validator.is_valid(json.loads(out))
        except ValueError:
            ok = False
        if not ok:
            counts["violations"] += 1
            examples.append(("walk", out[:200]))
    res.update(counts)
    res["mask_times"] = checker.mask_times
    if examples:
        res["violation_examples"] = examples
    return res
