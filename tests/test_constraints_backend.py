"""Both grammar backends (llguidance, outlines-core) on the real SmolLM2 tokenizer, no model:
vocabulary round trip, masks (EOS, padded vocab, row isolation), simulated decoding with and
without jump-forward validated by jsonschema, bad input; outlines budgets and caches."""

from __future__ import annotations

import json
import threading

import jsonschema
import llguidance as llg
import numpy as np
import pytest
from constraint_walks import accepts_text, allowed_ids, random_walk

from radixlm.constraints import ConstraintSpec, create_grammar_backend, spec_from_sampling_params
from radixlm.constraints.outlines_backend import OutlinesGrammarBackend

PAD = 96  # logits wider than the tokenizer, like a padded embedding


@pytest.fixture(scope="module", params=["llguidance", "outlines"])
def backend(tokenizer, request):
    extra = {"disk_cache": False} if request.param == "outlines" else {}
    be = create_grammar_backend(tokenizer, len(tokenizer) + PAD, [tokenizer.eos_token_id, 0],
                                backend=request.param, **extra)
    yield be
    be.shutdown()


def compile_(backend, **params):
    """Schemas here are about keywords, their texts written compactly or loosely: an
    optional space between tokens (the default style is test_json_whitespace_...'s)."""
    if "json_schema" in params:
        params.setdefault("whitespace_pattern", "[ ]?")
    return backend.compile_async(spec_from_sampling_params(params)).result(timeout=60)


KEYS = {"type": "object", "properties": {
    "first_name": {"type": "string", "maxLength": 10},
    "last_name": {"type": "string", "maxLength": 10},
    "year_of_birth": {"type": "integer", "minimum": 1900, "maximum": 2024},
    "favourite_colour": {"enum": ["red", "green", "blue"]},
    "is_active_member": {"type": "boolean"},
    "address": {"type": "object", "properties": {
        "street_name": {"type": "string"}, "postal_code": {"type": "string",
                                                           "pattern": "^[0-9]{5}$"}},
        "required": ["street_name", "postal_code"]}},
    "required": ["first_name", "last_name", "year_of_birth", "favourite_colour",
                 "is_active_member", "address"]}


def test_vocabulary_round_trip(tokenizer, backend):
    vocab = backend.vocab.id_to_bytes
    assert len(vocab) == len(tokenizer) - len(backend.vocab.special_ids)
    assert not set(vocab) & set(tokenizer.all_special_ids)
    for tid, data in vocab.items():
        text = tokenizer.decode([tid])
        try:
            assert data.decode("utf-8") == text, tid
        except UnicodeDecodeError:
            assert "\ufffd" in text, tid  # a partial character: the tokenizer can't show it
    sample = 'Zoë {"naïve": "日本語 🙂", "x": [1, 2.5e-3]}\n\tend'
    ids = tokenizer.encode(sample, add_special_tokens=False)
    assert b"".join(vocab[t] for t in ids) == sample.encode("utf-8")


def test_eos_only_in_final_states_and_padded_bits_unset(tokenizer, backend):
    g = compile_(backend, regex=r"[0-9]{2,3}")
    eos = backend.eos_ids
    digit = tokenizer.convert_tokens_to_ids("7")
    seen = []
    for _ in range(3):
        ids = set(allowed_ids(g, backend.words).tolist())
        seen.append(ids)
        assert max(ids) < len(tokenizer), "a padded-vocab bit was set"
        if len(seen) > 1 and g.is_accepting():
            assert set(eos) <= ids
        else:
            assert not set(eos) & ids
            assert not g.accept_token(eos[0])
        assert g.accept_token(digit)
    assert g.is_terminated()  # "777": only EOS left
    assert allowed_ids(g, backend.words).tolist() == sorted(eos)
    assert g.accept_token(eos[1]) and g.is_terminated()
    assert not g.accept_token(digit)
    g.rollback(2)
    assert not g.is_terminated() and g.accept_token(digit)


def test_rows_of_two_grammars_do_not_leak(tokenizer, backend):
    a = compile_(backend, choices=["yes", "no"])
    b = compile_(backend, dtype="int")
    mask = np.full((3, backend.words), -1, dtype=np.int32)
    a.fill_bitmask(mask, 0)
    b.fill_bitmask(mask, 1)
    alone = np.zeros((1, backend.words), dtype=np.int32)
    a.fill_bitmask(alone, 0)
    assert (mask[0] == alone[0]).all()
    b.fill_bitmask(alone, 0)
    assert (mask[1] == alone[0]).all()
    assert (mask[2] == -1).all()
    assert not (mask[0] & mask[1]).any()  # "yes"/"no" starts share nothing with digits


@pytest.mark.parametrize("jump", [False, True])
def test_json_schema_decoding_validates(tokenizer, backend, jump):
    g = compile_(backend, json_schema=KEYS)
    forced_total = 0
    for seed in range(4):
        out, done, forced = random_walk(g.copy(), tokenizer, backend.words, backend.eos_ids,
                                        seed, jump_forward=jump)
        assert done
        value = json.loads(tokenizer.decode(out))
        jsonschema.validate(value, KEYS, format_checker=jsonschema.FormatChecker())
        forced_total += forced
    if jump:
        assert forced_total > 20, "jump-forward never forced the keys"
    else:
        assert forced_total == 0


def test_jump_forward_plan_is_canonical_and_advances_state(tokenizer, backend):
    g = compile_(backend, json_schema=KEYS)
    first = tokenizer.encode('{"', add_special_tokens=False)
    out = []
    for t in first:
        assert g.accept_token(t)
        out.append(t)
    plan = g.jump_forward(out)
    assert plan is not None and plan.token_ids
    new_out = out[:len(out) - plan.rollback] + plan.token_ids
    text = tokenizer.decode(new_out)
    assert text.startswith('{"first_name"') and len(text) > len('{"first')
    # The plan is the tokenizer's own tokenization of the text (canonical boundary).
    assert new_out == tokenizer.encode(text, add_special_tokens=False)
    assert g.forced_text() == "" or len(g.forced_text()) < 2 or g.jump_forward(new_out)


def test_choices_and_dtypes(tokenizer, backend):
    choices = ["a", "ab", "abc", "Paris, France"]
    g = compile_(backend, choices=choices)
    got = set()
    for seed in range(12):
        out, done, _ = random_walk(g.copy(), tokenizer, backend.words, backend.eos_ids, seed,
                                   explore_steps=0)
        assert done
        got.add(tokenizer.decode(out))
    assert got <= set(choices) and len(got) >= 2
    for c in choices:  # every choice is reachable (leftmost-first regex pitfall)
        assert accepts_text(g, tokenizer, c)
    for dtype, parse in (("int", int), ("float", float), ("bool", json.loads)):
        g = compile_(backend, dtype=dtype)
        for seed in range(3):
            out, done, _ = random_walk(g.copy(), tokenizer, backend.words, backend.eos_ids,
                                       seed, explore_steps=3)
            assert done
            parse(tokenizer.decode(out))


def test_numbers_can_stop_on_a_space_or_newline(tokenizer, backend):
    """dtype int/float end after one space or newline (else only EOS or max tokens stop a
    model that keeps producing digits)."""
    for dtype, text in (("int", "42 "), ("int", "-7\n"), ("float", "2.5 ")):
        g = compile_(backend, dtype=dtype)
        for t in tokenizer.encode(text, add_special_tokens=False):
            assert g.accept_token(t)
        assert g.is_terminated(), (dtype, text)
    g = compile_(backend, dtype="int")
    for t in tokenizer.encode("42", add_special_tokens=False):
        assert g.accept_token(t)
    assert not g.is_terminated()  # more digits (or the space) may follow
    assert not accepts_text(g, tokenizer, "  ") and not accepts_text(g, tokenizer, " 1")


def test_bad_input(backend):
    cases = [
        ({"json_schema": "{bad json"}, "not valid JSON"),
        ({"json_schema": {"type": "object", "properties": {"a": {"minimum": "x"}}}},
         "invalid JSON schema"),
        ({"regex": "(a"}, "invalid regex"),
        ({"regex": "(" * 3000 + "a" + ")" * 3000}, "invalid regex.*recursion"),
        ({"json_schema": {"type": "string"}, "whitespace_pattern": "(" * 3000 + " " +
          ")" * 3000}, "invalid whitespace_pattern.*recursion"),
    ]
    if backend.name == "outlines":
        cases.append(({"json_schema": {"properties": {"a": {"type": "number", "multipleOf": 3}}}},
                      "multipleOf.*/properties/a/multipleOf"))
    else:
        cases += [({"json_schema": {"properties": {"a": {"divisibleBy": 2}}}},
                   "'divisibleBy' at JSON pointer '/properties/a'"),
                  ({"ebnf": 'root ::= "a" ('}, "invalid ebnf")]
    for params, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            backend.validate(spec_from_sampling_params(params))
    with pytest.raises(ValueError, match="at most one constraint"):
        spec_from_sampling_params({"regex": "a", "dtype": "int"})
    if backend.name == "llguidance":  # refused by llguidance and by the regex translator
        fut = backend.compile_async(spec_from_sampling_params(
            {"json_schema": {"properties": {"a": {"not": {"enum": [1]}}}}}))
        with pytest.raises(ValueError, match="Unimplemented keys.*not.*regex translation.*'not'"):
            fut.result(timeout=30)
    fut = backend.compile_async(ConstraintSpec("regex", r"a[^\x00-\U0010FFFF]b"))
    with pytest.raises(ValueError, match="empty language"):
        fut.result(timeout=30)
    # A failed request leaves the backend usable.
    assert compile_(backend, regex="ok") is not None


def test_budgets(tokenizer):
    be = OutlinesGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id],
                                disk_cache=False, max_index_mb=0.5)
    try:
        with pytest.raises(ValueError, match="index of .* exceeds the budget"):
            be.compile_async(ConstraintSpec("regex", r'"[a-z ]{0,30}"')).result(timeout=60)
        with pytest.raises(ValueError, match="regex of .* characters exceeds"):
            be.max_regex_chars = 50
            be.validate(ConstraintSpec("choices", tuple(f"choice{i}" for i in range(20))))
        be.max_regex_chars = 100_000
        be.compile_timeout_s = 0.001
        with pytest.raises(ValueError, match="time budget"):
            be.compile_async(ConstraintSpec("regex", r"[a-z]{1,12}@[a-z]{1,12}")).result(30)
        be.compile_timeout_s, be.max_states = 30.0, 10
        with pytest.raises(ValueError, match="automaton states exceed the budget of 10"):
            be.compile_async(ConstraintSpec("regex", r"[a-z]{20}")).result(timeout=30)
        assert be.stats()["failures"] >= 3
    finally:
        be.shutdown()


def test_compiles_off_thread_and_caches(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    be = OutlinesGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    threads = []
    build = be._build
    monkeypatch.setattr(be, "_build", lambda *a: threads.append(
        threading.current_thread().name) or build(*a))
    spec = ConstraintSpec("regex", r"(cat|dog)s?")
    g1 = be.compile_async(spec).result(timeout=30)
    g2 = be.compile_async(spec).result(timeout=30)
    assert threads and all(t.startswith("grammar-compile") for t in threads)
    assert g1 is not g2 and g1.c is g2.c  # fresh state, shared compiled form
    assert be.stats()["compiles"] == 1 and be.stats()["memory_hits"] == 1
    assert list((tmp_path / "grammars").glob("*.pkl"))
    be.shutdown()
    be2 = OutlinesGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    g3 = be2.compile_async(spec).result(timeout=30)
    assert be2.stats()["disk_hits"] == 1
    assert accepts_text(g3, tokenizer, "dogs") and not accepts_text(g3, tokenizer, "cow")
    be2.shutdown()


@pytest.fixture(scope="module")
def llguidance_backend(tokenizer):
    be = create_grammar_backend(tokenizer, len(tokenizer) + PAD, [tokenizer.eos_token_id, 0],
                                backend="llguidance")
    yield be
    be.shutdown()


def test_llguidance_schema_prep_is_sound(tokenizer, llguidance_backend):
    """oneOf of type-disjoint branches (through a $ref) runs as anyOf; listed properties
    close the object; uniqueItems keeps arrays to one item; draft-3 keywords are refused."""
    backend = llguidance_backend
    schema = {"$defs": {"when": {"type": "object", "properties": {"at": {"type": "integer"}},
                                 "required": ["at"]}},
              "type": "object", "required": ["t", "tags"],
              "properties": {"t": {"oneOf": [{"$ref": "#/$defs/when"}, {"type": "null"}]},
                             "tags": {"type": "array", "items": {"type": "string"},
                                      "uniqueItems": True}}}
    g = compile_(backend, json_schema=schema)
    for text, ok in (('{"t":null,"tags":[]}', True), ('{"t":{"at":3},"tags":["a"]}', True),
                     ('{"t":"x","tags":[]}', False), ('{"t":null,"tags":["a","b"]}', False),
                     ('{"t":null,"tags":[],"extra":1}', False)):
        assert accepts_text(g, tokenizer, text) == ok, text
        if ok:
            jsonschema.validate(json.loads(text), schema)
    overlapping = {"oneOf": [{"type": "number"}, {"type": "integer"}]}
    with pytest.raises(ValueError, match="oneOf"):
        compile_(backend, json_schema=overlapping)


STR, INT = {"type": "string"}, {"type": "integer"}
D7 = "http://json-schema.org/draft-07/schema#"  # "dependencies" is a keyword up to draft 7
PREP_DEFS = {"prim": {"type": "string", "enum": ["int", "long"]},
             "jq": {"required": ["type"], "properties": {"type": {"enum": ["jq"]}},
                    "additionalProperties": False},
             "git": {"required": ["type", "path"], "additionalProperties": False,
                     "properties": {"type": {"enum": ["git"]}, "path": STR}}}
# name, schema, valid instances (accepted), invalid instances (rejected)
ENFORCED = [
    ("dependencies list", {"$schema": D7, "type": "object",
                           "properties": {"a": STR, "b": STR, "c": STR},
                           "dependencies": {"a": ["b"]}},
     [{}, {"b": "y"}, {"a": "x", "b": "y"}], [{"a": "x"}, {"a": "x", "c": "z"}]),
    ("dependentRequired", {"$schema": "https://json-schema.org/draft/2020-12/schema",
                           "type": "object", "properties": {"a": STR, "b": STR},
                           "dependentRequired": {"a": ["b"], "b": ["a"]}},
     [{}, {"a": "x", "b": "y"}], [{"a": "x"}, {"b": "y"}]),
    ("dependencies schema", {"$schema": D7, "type": "object",
                             "properties": {"kind": STR, "url": STR},
                             "dependencies": {"url": {"properties": {"kind": {"enum": ["link"]}},
                                                      "required": ["kind"]}}},
     [{"kind": "x"}, {"kind": "link", "url": "u"}], [{"url": "u"}, {"kind": "x", "url": "u"}]),
    ("dependentSchemas", {"type": "object", "properties": {"kind": STR, "url": STR},
                          "dependentSchemas": {"url": {"properties": {"kind": {"enum": ["link"]}},
                                                       "required": ["kind"]}}},
     [{"kind": "x"}, {"kind": "link", "url": "u"}], [{"url": "u"}, {"kind": "x", "url": "u"}]),
    ("not required", {"type": "object", "properties": {"a": INT, "b": INT},
                      "not": {"required": ["b"]}}, [{}, {"a": 1}], [{"a": 1, "b": 2}]),
    ("not properties", {"type": "object", "properties": {"kind": STR, "n": INT},
                        "required": ["kind"], "not": {"properties": {"kind": {"enum": ["car"]}}}},
     [{"kind": "bus"}, {"kind": "bus", "n": 1}], [{"kind": "car"}, {"kind": "car", "n": 2}]),
    ("not const any type", {"type": "object", "properties": {"v": {"not": {"const": "x"}}},
                            "required": ["v"]},
     [{"v": "y"}, {"v": 3}, {"v": None}], [{"v": "x"}, {}]),
    ("not enum", {"type": "string", "not": {"enum": ["null", "int", "in"]}},
     ["", "i", "nul", "int2", "ab"], ["null", "int", "in", 3]),
    ("not $ref enum", {"$defs": PREP_DEFS, "type": "string", "pattern": "^[a-z]+$",
                       "not": {"$ref": "#/$defs/prim"}}, ["lon", "longer", "x"],
     ["int", "long", "A"]),
    ("not class pattern", {"type": "string", "minLength": 1,
                           "not": {"pattern": "^[.,\\-]+$"}},
     ["a", "-a", ". x", " "], [".", "-,-", "..\n", ""]),
    ("oneOf required", {"type": "object", "properties": {"a": INT, "b": INT},
                        "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
     [{"a": 1}, {"b": 2}], [{"a": 1, "b": 2}, {}]),
    ("oneOf discriminator", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "x"}, "v": INT}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "y"}, "w": STR},
         "required": ["kind"]}]},
     [{"kind": "x", "v": 1}, {"kind": "y", "w": "s"}], [{"kind": "z"}, {"kind": "y", "w": 1}]),
    ("oneOf untyped refs", {"$defs": PREP_DEFS, "type": "array",
                            "items": {"oneOf": [{"$ref": "#/$defs/jq"}, {"$ref": "#/$defs/git"}]}},
     [[{"type": "jq"}, {"type": "git", "path": "p"}]], [[{"type": "x"}], ["s"], [{}]]),
    ("oneOf branchwise", {"$defs": PREP_DEFS, "type": "array", "items": {"oneOf": [
        {"type": "object", "oneOf": [{"$ref": "#/$defs/jq"}, {"$ref": "#/$defs/git"}]},
        {"type": "object", "additionalProperties": {"enum": [False]}, "minProperties": 1,
         "maxProperties": 1}]}},
     [[{"type": "jq"}], [{"x": False}], [{"type": False}]],
     [[{"type": "hg"}], [{"x": True}], [{}]]),
    ("oneOf overlapping types", {"type": "object", "required": ["v"], "properties": {"v": {
        "oneOf": [{"type": ["array", "null"], "items": INT}, {"type": "null"},
                  {"type": "boolean"}]}}},
     [{"v": [1]}, {"v": True}, {"v": []}], [{"v": None}, {"v": ["a"]}]),
    ("oneOf overlapping enums", {"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]},
     ["a", "c"], ["b", "d"]),
    ("oneOf pattern prefixes", {"oneOf": [{"type": "string", "pattern": "^https?://.+$"},
                                          {"type": "string", "pattern": "^\\./.+$"}]},
     ["./a", "http://x"], ["x", "./", 1]),
    ("oneOf not", {"$defs": PREP_DEFS, "oneOf": [
        {"$ref": "#/$defs/prim"}, {"type": "string", "not": {"$ref": "#/$defs/prim"}}]},
     ["int", "x", ""], [3, None]),
    ("format aliases", {"type": "array", "prefixItems": [
        {"type": "string", "format": "uri-reference"}, {"type": "string", "format": "color"},
        {"type": "string", "format": "json-pointer"}]}, [["http://a.b/c", "#a0b1c2", "/a/0"]],
     []),
]


@pytest.mark.parametrize("name,schema,valid,invalid", ENFORCED, ids=[c[0] for c in ENFORCED])
def test_llguidance_enforces_rewritten_keywords(tokenizer, llguidance_backend, name, schema,
                                               valid, invalid):
    """Keywords llguidance lacks but prep rewrites (dependencies, not forms, oneOf made
    disjoint, formats): valid instances accepted, invalid ones rejected, random walks
    validate under jsonschema (format checker on)."""
    be = llguidance_backend
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    g = compile_(be, json_schema=schema)
    # compiled by llguidance itself from the rewritten schema, not by the translator fallback
    grammar = be.to_grammar(spec_from_sampling_params({"json_schema": schema}))
    assert not llg.LLMatcher.validate_grammar(grammar, None)
    for value in valid + invalid:
        text = json.dumps(value, separators=(",", ":"))
        ok = validator.is_valid(value)
        assert ok == (value in valid), (value, "the case itself is wrong")
        assert accepts_text(g.copy(), tokenizer, text) == ok, text
    done = 0
    for seed in range(4):
        out, finished, _ = random_walk(g.copy(), tokenizer, be.words, be.eos_ids, seed,
                                       explore_steps=20, max_steps=200)
        if finished:
            done += 1
            assert validator.is_valid(json.loads(tokenizer.decode(out))), tokenizer.decode(out)
    assert done >= 2


@pytest.mark.parametrize("schema,word", [
    ({"type": "integer", "not": {"minimum": 3}}, "not"),
    ({"$schema": D7, "type": "object", "properties": {"a": STR}, "required": ["a"],
      "dependencies": {"a": {"minProperties": 2}}}, "dependencies"),
    ({"oneOf": [{"required": ["a"]}, {"required": ["a"]}]}, "oneOf"),
    ({"type": "object", "properties": {"a": STR}, "not": {"required": ["a", "b"]}}, "not"),
])
def test_llguidance_unrewritable_forms_still_rejected_by_name(llguidance_backend, schema, word):
    with pytest.raises(ValueError, match=word):
        compile_(llguidance_backend, json_schema=schema)


def test_oneof_proofs_are_bounded(monkeypatch):
    """The disjointness prover has a step budget per schema: a oneOf it cannot finish within
    it stays oneOf (for the compiler to refuse), so no schema holds the request thread."""
    from radixlm.constraints.schema import llg_rewrite as llg_schema

    branches = [{"type": "object", "required": ["k"], "properties": {"k": {"const": i}}}
                for i in range(40)]
    assert "anyOf" in llg_schema.prepare_schema({"oneOf": branches})
    monkeypatch.setattr(llg_schema, "MAX_PROOF_STEPS", 100)  # 780 pairs need more
    assert "oneOf" in llg_schema.prepare_schema({"oneOf": branches})


def test_python_whitespace_class_list():
    import re
    import sys

    from radixlm.constraints.schema.llg_negation import _PY_SPACE

    assert _PY_SPACE == [c for c in range(sys.maxunicode + 1) if re.fullmatch(r"\s", chr(c))]


def test_deadlines_fire_in_order_and_cancel():
    """The compile budgets run on one deadline thread: callbacks fire once, in deadline
    order, and a cancelled one never fires."""
    import time

    from radixlm.constraints.base import DEADLINES

    fired: list[str] = []
    done = threading.Event()
    DEADLINES.call_later(0.10, fired.append, "late")
    cancel = DEADLINES.call_later(0.05, fired.append, "cancelled")
    DEADLINES.call_later(0.02, fired.append, "early")
    DEADLINES.call_later(0.15, done.set)
    cancel()
    assert done.wait(10)
    time.sleep(0.05)
    assert fired == ["early", "late"]


def test_json_whitespace_default_style_none_and_patterns(tokenizer, backend):
    """The default is json.dumps's style (``", "`` between items, ``": "`` after keys,
    nothing else); ``whitespace_pattern: ""`` allows no whitespace (it once fell back to
    the default), as SGLang's ``--constrained-json-disable-any-whitespace`` does; a pattern
    (a request's own, or the server's) allows it between any two tokens."""
    from radixlm.runtime.config import EngineConfig

    schema = {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}}}
    styled, compact, loose = '{"a": 1, "b": [2, 3]}', '{"a":1,"b":[2,3]}', '{ "a" : 1 , "b":[2,3]}'

    def accepts(spec, text):
        return accepts_text(backend.compile_async(spec).result(timeout=60), tokenizer, text)

    default = spec_from_sampling_params({"json_schema": schema}, EngineConfig().json_whitespace)
    assert default.whitespace_pattern is None
    assert accepts(default, styled)
    assert not accepts(default, compact) and not accepts(default, loose)
    no_ws = EngineConfig(constrained_json_disable_any_whitespace=True).json_whitespace
    none = spec_from_sampling_params({"json_schema": schema}, no_ws)
    assert accepts(none, compact) and not accepts(none, styled)
    spec = spec_from_sampling_params({"json_schema": schema, "whitespace_pattern": ""})
    assert accepts(spec, compact) and not accepts(spec, styled)
    server = EngineConfig(constrained_json_whitespace_pattern="[ ]?").json_whitespace
    spec = spec_from_sampling_params({"json_schema": schema}, server)
    assert accepts(spec, loose) and accepts(spec, compact) and accepts(spec, styled)
    spec = spec_from_sampling_params({"json_schema": schema, "whitespace_pattern": ""}, server)
    assert not accepts(spec, styled)  # the request's own pattern wins


def test_byte_level_token_bytes_match_gpt2s_alphabet():
    """A byte-level token's bytes are its characters through the inverse of GPT-2's
    ``bytes_to_unicode`` (transformers' table); a character outside that alphabet (a raw
    space, U+0080, a Euro sign, an emoji) spells no bytes: None, never a guess."""
    import random

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from radixlm.constraints.vocab import token_bytes

    alphabet = bytes_to_unicode()  # byte -> its stand-in character
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        assert token_bytes("".join(alphabet[b] for b in data), True) == data
    assert token_bytes("", True) == b""
    for bad in (" ", "\x80", "\u20ac", "\U0001f600"):
        token = alphabet[ord("a")] + bad
        assert token_bytes(token, True) is None, repr(bad)
    assert token_bytes("\u2581hi<", False) == b" hi<"
    assert token_bytes("<0x0A>", False) == b"\n"


def test_llguidance_tokenizer_json_is_what_llguidance_serializes(tokenizer):
    """The backend parses the JSON ``llguidance.hf.from_tokenizer`` would (padding and
    truncation off) whether or not the tokenizer has them set, and never changes the
    caller's tokenizer; its tokenizer is made once, on first use, by whichever caller
    comes first."""
    import copy

    import llguidance.hf

    from radixlm.constraints.llguidance_backend import LLGuidanceBackend, _tokenizer_json

    def reference(tok) -> str:  # llguidance.hf.from_tokenizer's serialization
        backend = copy.copy(tok.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        return backend.to_str()

    tok = copy.deepcopy(tokenizer)
    assert _tokenizer_json(tok) == reference(tok)
    tok.backend_tokenizer.enable_truncation(max_length=7)
    tok.backend_tokenizer.enable_padding(length=9)
    assert json.loads(_tokenizer_json(tok))["truncation"] is None
    assert _tokenizer_json(tok) == reference(tok)
    assert tok.backend_tokenizer.truncation["max_length"] == 7  # the caller's, untouched
    backend = LLGuidanceBackend(tok, vocab_size=len(tok), eos_token_ids=[tok.eos_token_id])
    try:
        assert backend._ll_tokenizer is None  # nothing parsed before a compile needs it
        text = "Hello, world! 123"
        ours = backend.ll_tokenizer.tokenize_str(text)
        assert ours == llguidance.hf.from_tokenizer(tok).tokenize_str(text)
        assert backend.ll_tokenizer is backend.ll_tokenizer
    finally:
        backend.shutdown()


def test_a_tokenizer_llguidance_cannot_parse_fails_each_compile_by_name(tokenizer, caplog,
                                                                        monkeypatch):
    """Where llguidance cannot parse the tokenizer (made after the engine is ready), warm()
    logs it and every compile fails with a ValueError saying so; the parse is tried once."""
    from radixlm.constraints import llguidance_backend as lb

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("unknown pre-tokenizer")

    monkeypatch.setattr(lb.llg, "LLTokenizer", refuse)
    backend = lb.LLGuidanceBackend(tokenizer, vocab_size=len(tokenizer),
                                   eos_token_ids=[tokenizer.eos_token_id])
    try:
        with caplog.at_level("WARNING", logger=lb.__name__):
            backend.warm()
            for _ in range(200):
                if "cannot read" in caplog.text:
                    break
                threading.Event().wait(0.05)
        assert "llguidance cannot read this tokenizer: unknown pre-tokenizer" in caplog.text
        for _ in range(2):
            with pytest.raises(ValueError, match="cannot read this tokenizer: unknown pre-"):
                backend.compile(ConstraintSpec("regex", "[ab]+"))
        assert len(calls) == 1
    finally:
        backend.shutdown()


def test_a_checked_spec_is_found_again_by_value(llguidance_backend, monkeypatch):
    """validate() keeps the grammar and its compiled-cache key under the spec itself: an
    equal spec of another request (its own text object) finds both, and the compile hits
    the compiled-grammar cache without making the grammar or its key again."""
    from radixlm.constraints import llguidance_backend as llb

    be = llguidance_backend
    text = json.dumps({"type": "object", "properties": {"k": {"type": "string"}}})
    be.validate(spec_from_sampling_params({"json_schema": text}))
    be.compile(spec_from_sampling_params({"json_schema": text}))
    made = []
    monkeypatch.setattr(be, "to_grammar", lambda spec: made.append("grammar"))
    monkeypatch.setattr(llb, "cache_key", lambda *parts: made.append("key"))
    again = spec_from_sampling_params({"json_schema": "".join(text)})  # (an equal, new spec)
    be.validate(again)
    grammar = be.compile(again)
    assert made == [] and isinstance(grammar, llb.LLGuidanceGrammar)
