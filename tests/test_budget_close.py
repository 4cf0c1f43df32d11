"""complete_within_max_tokens: a constrained output closes a valid document within
max_new_tokens. Random walks (uniform among the allowed tokens, the harshest model there is)
through the real postprocessor on the real tokenizer, under JSONSchemaBench sample schemas
(a fixed subset covering every feature and source of the sample, closes of every length
and both refusals; benchmarks/bench_budget_close.py runs the whole sample): every output
parses and validates, never runs past the budget, never writes a token the mask forbids,
and is the natural output when the budget fits it; regex, EBNF and a thinking block too.
Then the real model in-process and over HTTP (the `openai` client): n > 1, streaming, the
server default, the 400s."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import openai
import pytest
from closing_walk import assert_masked_every_step, walk
from server_fakes import ThreadServer

from radixlm.constraints import ConstraintSpec, create_grammar_backend
from radixlm.constraints.budget import fits_budget

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
CEILING = 256


def _schema(row) -> dict:
    return json.loads(row["schema"]) if isinstance(row["schema"], str) else row["schema"]


def _valid(schema: dict, text: str) -> None:
    """``text`` parses and validates (the schema's own draft; the sample's schemas are not
    all metaschema-valid themselves, so the schema is not checked)."""
    cls = jsonschema.validators.validator_for(schema)
    cls(schema).validate(json.loads(text))


def _text(tokenizer, req) -> str:
    ids = req.output_ids
    if req.finish_reason.get("type") == "stop" and isinstance(req.finish_reason.get("matched"),
                                                              int):
        ids = ids[:-1]
    return tokenizer.decode(ids)


@pytest.fixture(scope="module")
def backend(tokenizer):
    be = create_grammar_backend(tokenizer, len(tokenizer), [tokenizer.eos_token_id],
                                backend="llguidance")
    yield be
    be.shutdown()


@pytest.fixture(scope="module")
def compiled(backend):
    """(row, schema, grammar) of every sample schema that compiles."""
    out = []
    for row in ROWS:
        schema = _schema(row)
        try:
            g = backend.compile(ConstraintSpec("json_schema", json.dumps(schema)))
        except ValueError:
            continue
        out.append((row, schema, g))
    return out


REFUSED = {"o43012", "o34345"}  # shortest documents found of 551 and 1217 tokens
# strings under unanchored patterns (found by the search's pattern hints)
PATTERNS = {"azure-iot-edgehub-deployment-1.2", "o3906", "sp_204_Normalized"}


def _features(row) -> set[str]:
    return {*row["features"], "subset:" + row["subset"]}


def _shapes(rows: list[dict]) -> set[str]:
    """The ids of a fixed subset of the sample that covers its distinct shapes: greedily, the
    schema adding the most (feature, source) pairs seen fewer than twice so far (ties: the
    shorter schema, then file order); every 6th row (closes of every length, up to ~230
    tokens); two the up-front check refuses (closes of 551 and 1217 tokens); and three whose
    close must end a string under an unanchored pattern."""
    need = {f: 2 for row in rows for f in _features(row)}
    chosen, left = set(), list(rows)

    def gain(row) -> int:
        return sum(need[f] > 0 for f in _features(row))

    while left:
        best = max(left, key=lambda row: (gain(row), -len(json.dumps(row["schema"]))))
        if not gain(best):
            break
        left.remove(best)
        chosen.add(best["unique_id"])
        for f in _features(best):
            need[f] -= 1
    return chosen | {row["unique_id"] for row in rows[::6]} | REFUSED | PATTERNS


@pytest.fixture(scope="module")
def shapes(compiled):
    keep = _shapes(ROWS)
    out = [c for c in compiled if c[0]["unique_id"] in keep]
    assert len(out) >= 50 and REFUSED | PATTERNS <= {row["unique_id"] for row, _, _ in out}
    return out


def test_sample_schemas_of_every_shape_close_valid_within_their_budget(backend, tokenizer,
                                                                       shapes):
    """Per schema: a walk at the tightest budget (the start's close length), and for every
    third one at a random budget up to 256. A schema the up-front check refuses is one whose
    close is longer than the budget (the refusal names both numbers); every close is found."""
    rng = random.Random(0)
    walked = refused = not_found = closed = 0
    for k, (row, schema, template) in enumerate(shapes):
        start = template.copy().close_tokens()
        if start is None:
            not_found += 1
            with pytest.raises(ValueError, match="no valid completion"):
                fits_budget(template.copy(), CEILING)
            continue
        assert (len(start) > CEILING) == (row["unique_id"] in REFUSED), \
            (row["unique_id"], len(start))
        if len(start) > CEILING:
            refused += 1
            with pytest.raises(ValueError, match=f"takes {len(start)} tokens, more than "
                                                 f"max_new_tokens={CEILING}"):
                fits_budget(template.copy(), CEILING)
            continue
        loose = rng.randint(len(start), CEILING)  # (every third schema: the suite's time)
        for budget in (len(start), loose) if k % 3 == 0 else (len(start),):
            g = fits_budget(template.copy(), budget)
            req = walk(backend, tokenizer, g, budget, seed=k * 7 + budget)
            where = f"{row['unique_id']} at budget {budget}: {_text(tokenizer, req)[:200]!r}"
            assert req.finish_reason["type"] in ("length", "stop"), (where, req.finish_reason)
            assert len(req.output_ids) <= budget, where
            _valid(schema, _text(tokenizer, req))
            assert_masked_every_step(template.copy(), req.output_ids, backend.words)
            walked += 1
            if req.closed_at is not None:
                closed += 1
                assert req.finish_reason == {"type": "length", "length": len(req.output_ids)}
    # most sample schemas fit 256 tokens; the tightest budgets are all closed by force
    assert walked >= 1.3 * 0.9 * len(shapes) and closed >= len(shapes) * 0.9, \
        (walked, refused, not_found, closed)
    assert not_found == 0 and refused == len(REFUSED), (not_found, refused)


def test_the_grammar_keeps_the_close_that_fit_for_a_rollback(backend, tokenizer):
    """``close_fits`` keeps the close that fit; after the next token is taken back,
    ``close_tokens`` returns it (no longer than the room then); a rollback past the state it
    was kept at forgets it."""
    schema = {"type": "object", "required": ["name", "tags"], "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}
    g = backend.compile(ConstraintSpec("json_schema", json.dumps(schema)))
    ids = tokenizer.encode('{"name": "Ann', add_special_tokens=False)
    for t in ids:
        assert g.accept_token(t)
    need = len(g.copy().close_tokens())
    assert not g.close_fits(need - 1) and g.close_fits(need)
    kept = g.close_tokens()
    assert len(kept) <= need
    assert g.accept_token(tokenizer.encode(" Lee", add_special_tokens=False)[0])
    assert not g.close_fits(0)  # (a check that fails keeps nothing)
    g.rollback(1)
    assert g.close_tokens() == kept
    g.rollback(1)
    assert g._fit is None  # (kept one token later than this state)
    close = g.close_tokens()
    for t in close:
        assert g.accept_token(t)
    assert g.is_accepting()


def _slack(template, output_ids: list[int], most: int = 32) -> int:
    """How many tokens past its own length a finished output needs for a close to fit the
    room left after each of its tokens, as the postprocessor asks (``close_fits``; the
    closes are short, not always the shortest: 0 for most documents)."""
    n = len(output_ids)
    for slack in range(most):
        g = template.copy()
        if all(g.accept_token(t) and g.close_fits(n + slack - i - 1)
               for i, t in enumerate(output_ids[:-1])):  # (the last: EOS, a stop)
            return slack
    return most


def test_a_document_that_fits_is_not_changed(backend, tokenizer, compiled):
    """A walk that ends by itself, replayed with the option on at its length (plus the slack
    its closes need, 0 for most) and with room to spare: the same tokens, the same finish.
    Jump-forward off: its retokenized boundaries are not the tokens a replay is fed."""
    checked = exact = 0
    for k, (row, _, template) in enumerate(compiled[::3]):
        natural = walk(backend, tokenizer, template.copy(), CEILING, seed=k, close=False,
                       eos_rate=0.5, jump_forward=False)
        if natural.finish_reason["type"] != "stop":
            continue
        slack = _slack(template, natural.output_ids)
        n = len(natural.output_ids) + max(0, slack)
        exact += slack <= 0
        for budget in (n, n + 5):
            again = walk(backend, tokenizer, template.copy(), budget, seed=k,
                         script=natural.fed, jump_forward=False)
            assert again.output_ids == natural.output_ids, (row["unique_id"], budget)
            assert again.finish_reason == natural.finish_reason and again.closed_at is None
        checked += 1
    assert checked >= 20 and exact >= 0.8 * checked, (checked, exact)


@pytest.mark.parametrize("kind,value,check", [
    ("regex", r"\((\d{1,3}, )*\d{1,3}\)", r"\((\d{1,3}, )*\d{1,3}\)"),
    ("regex", r"[a-z]+@[a-z]+\.(com|org)", r"[a-z]+@[a-z]+\.(com|org)"),
    ("ebnf", 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9]+ | "\\"" [a-z]* "\\""',
     r'\[(\d+|"[a-z]*")(,(\d+|"[a-z]*"))*\]'),
])
def test_regex_and_ebnf_close_within_the_budget(backend, tokenizer, kind, value, check):
    import re

    template = backend.compile(ConstraintSpec(kind, value))
    start = len(template.copy().close_tokens())
    for seed, budget in enumerate([start, start + 1, 7, 16, 40] * 3):
        if budget < start:
            continue
        req = walk(backend, tokenizer, fits_budget(template.copy(), budget), budget, seed=seed)
        text = _text(tokenizer, req)
        assert len(req.output_ids) <= budget and re.fullmatch(check, text), (budget, text)
        assert_masked_every_step(template.copy(), req.output_ids, backend.words)


def test_jump_forward_off_closes_the_same_way(backend, tokenizer, compiled):
    for k, (_row, schema, template) in enumerate(compiled[:40]):
        start = template.copy().close_tokens()
        if start is None or len(start) > 48:
            continue
        req = walk(backend, tokenizer, template.copy(), 48, seed=k, jump_forward=False)
        _valid(schema, _text(tokenizer, req))
        assert len(req.output_ids) <= 48


def test_the_close_counts_the_end_of_a_thinking_block(backend, tokenizer):
    """With a reasoning parser the close is the rest of the end tag, then the answer's."""
    from radixlm.constraints.after_reasoning import ReasoningGrammars, ReasoningSpec
    from radixlm.constraints.reasoning import REASONING, ReasoningParser, get_format

    fmt = get_format("deepseek-r1")
    grammars = ReasoningGrammars(backend, fmt)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {
        "type": "boolean"}}, "required": ["n", "ok"]}
    spec = ConstraintSpec("json_schema", json.dumps(schema))
    start = None
    for seed in range(8):
        g = grammars.compile_async(ReasoningSpec(spec, REASONING)).result()
        start = start or len(g.close_tokens())
        budget = start + 3 * seed
        req = walk(backend, tokenizer, fits_budget(g, budget), budget, seed=seed)
        text = _text(tokenizer, req)
        assert len(req.output_ids) <= budget and "</think>" in text, text
        _, answer = ReasoningParser(fmt, REASONING).parse(text)
        _valid(schema, answer)
    assert start > len(tokenizer.encode("</think>", add_special_tokens=False))


# ------------------------------------------------------------------ the real model

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "age": {"type": "integer"}}, "required": ["name", "tags", "age"]}
PROMPT = "Describe a cat as JSON with a name, many tags and an age."


@pytest.fixture(scope="module")
def engine():
    from radixlm.runtime.engine import Engine

    with Engine(max_total_tokens=8192, log_level="warning",
                complete_within_max_tokens=True) as e:
        yield e


def test_engine_closes_every_sample_of_n_and_streams_the_same(engine):
    params = {"max_new_tokens": 24, "temperature": 1.0, "seed": 3, "n": 4,
              "json_schema": json.dumps(PERSON)}
    outs = engine.generate(PROMPT, params)
    assert len(outs) == 4
    for out in outs:
        meta = out["meta_info"]
        _valid(PERSON, out["text"])
        assert meta["completion_tokens"] <= 24 and "closed_by_budget" in meta
        if meta["closed_by_budget"]:
            assert meta["finish_reason"]["type"] == "length" and 0 <= meta["closed_at"] < 24
    one = {**params, "n": 1}
    chunks = list(engine.generate(PROMPT, one, stream=True))
    final = engine.generate(PROMPT, one)
    assert chunks[-1]["text"] == final["text"] and chunks[-1]["output_ids"] == final["output_ids"]
    assert all(final["text"].startswith(c["text"]) for c in chunks)
    _valid(PERSON, final["text"])


def test_engine_default_applies_to_constrained_requests_only(engine):
    free = engine.generate(PROMPT, {"max_new_tokens": 6, "temperature": 0})
    assert "closed_by_budget" not in free["meta_info"]
    off = engine.generate(PROMPT, {"max_new_tokens": 12, "temperature": 0,
                                   "json_schema": json.dumps(PERSON),
                                   "complete_within_max_tokens": False})
    assert "closed_by_budget" not in off["meta_info"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(off["text"])  # 12 tokens cut this document
    on = engine.generate(PROMPT, {"max_new_tokens": 16, "temperature": 0,
                                  "json_schema": json.dumps(PERSON)})
    _valid(PERSON, on["text"])
    assert on["meta_info"]["closed_by_budget"] is True


def test_engine_refuses_what_cannot_fit_and_a_request_with_nothing_to_close(engine):
    out = engine.generate(PROMPT, {"max_new_tokens": 5, "json_schema": json.dumps(PERSON)})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["error"] == "invalid_constraint"
    assert "more than max_new_tokens=5" in reason["message"] and out["text"] == ""
    with pytest.raises(ValueError, match="complete_within_max_tokens needs a constraint"):
        engine.generate(PROMPT, {"max_new_tokens": 5, "complete_within_max_tokens": True})
    with pytest.raises(ValueError, match="complete_within_max_tokens must be a bool"):
        engine.generate(PROMPT, {"json_schema": "{}", "complete_within_max_tokens": "yes"})


@pytest.fixture(scope="module")
def client(engine):
    from radixlm.server.app import create_app

    with ThreadServer(create_app(engine)) as server:
        yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_response_format_closes_within_max_tokens(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": PERSON}}
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=18,
        temperature=0, response_format=fmt, extra_body={"complete_within_max_tokens": True})
    choice = out.choices[0]
    _valid(PERSON, choice.message.content)
    assert choice.finish_reason == "length" and choice.closed_by_budget is True
    assert 0 <= choice.closed_at < 18 and out.usage.completion_tokens <= 18
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=18,
        temperature=0, response_format=fmt, stream=True)  # the server's default is on
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    last = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.finish_reason == "length" and last.closed_at == choice.closed_at


def test_openai_400s_name_the_problem(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": PERSON}}
    with pytest.raises(openai.BadRequestError, match="more than max_new_tokens=4"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
            response_format=fmt)
    with pytest.raises(openai.BadRequestError, match="complete_within_max_tokens"):
        client.completions.create(model="m", prompt="x", max_tokens=4,
                                  extra_body={"complete_within_max_tokens": True})


def test_drafts_are_cut_where_the_close_is_forced():
    """Speculation on (NGRAM drafts copied from the prompt) and off: the same greedy tokens at
    every budget (drafts accepted), the close forced below the natural length, the JSON valid."""
    from radixlm.runtime.engine import Engine

    record = ('{"name": "Ann Lee", "tags": ["red", "blue", "green", "yellow", "purple", '
              '"orange"], "age": 31}')
    prompt = f"Copy this JSON exactly, nothing else:\n{record}\n{record}\n"
    outs, budgets = {}, (15, 17, 19, 40)
    for algo in ("NGRAM", "none"):
        with Engine(max_total_tokens=4096, log_level="warning", speculative_algorithm=algo,
                    complete_within_max_tokens=True) as e:
            outs[algo] = [e.generate(prompt, {"max_new_tokens": budget, "temperature": 0,
                                              "json_schema": json.dumps(PERSON)})
                          for budget in budgets]
    accepted = 0
    for spec, plain in zip(outs["NGRAM"], outs["none"]):
        assert spec["output_ids"] == plain["output_ids"]
        _valid(PERSON, spec["text"])
        accepted += spec["meta_info"].get("spec_accept_token_num", 0)
    natural = len(outs["none"][-1]["output_ids"])  # (40: room to spare, ends by itself)
    assert natural < budgets[-1] and not outs["NGRAM"][-1]["meta_info"]["closed_by_budget"]
    for budget, out in zip(budgets, outs["NGRAM"]):
        meta = out["meta_info"]
        if budget < natural:
            assert meta["closed_by_budget"] and meta["finish_reason"]["type"] == "length"
            assert meta["completion_tokens"] <= budget
    assert accepted > 0
