"""Constraints inside the batch on the real model: outputs conform, masks don't leak,
jump-forward on and off both valid, bad constraints fail clearly and alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "email": {"type": "string", "format": "email"}},
    "required": ["name", "age"],
}


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


@pytest.fixture(scope="module")
def jf_off_engine():
    from radixlm.runtime.engine import Engine

    with Engine(dtype="float32", max_total_tokens=8192, enable_jump_forward=False,
                log_level="warning") as engine:
        yield engine


def test_mixed_batch_each_row_follows_its_own_constraint(engine_default, tokenizer):
    prompts = [chat(tokenizer, "Describe Ada Lovelace as JSON."),
               chat(tokenizer, "What is the phone number of the office?"),
               chat(tokenizer, "Is the sky blue? Answer yes or no."),
               chat(tokenizer, "Write a short greeting."),
               chat(tokenizer, "How many legs does a spider have?")]
    params = [
        {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(PERSON)},
        {"temperature": 0, "max_new_tokens": 20, "regex": r"\(\d{3}\) \d{3}-\d{4}"},
        {"temperature": 0, "max_new_tokens": 8, "choices": ["yes", "no", "maybe not"]},
        {"temperature": 0, "max_new_tokens": 12},
        {"temperature": 0.8, "max_new_tokens": 8, "dtype": "int", "seed": 3},
    ]
    free_alone = engine_default.generate(prompts[3], params[3])
    outs = engine_default.generate(prompts, params)
    jsonschema.validate(json.loads(outs[0]["text"]), PERSON)
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", outs[1]["text"])
    assert outs[2]["text"] in ("yes", "no", "maybe not")
    assert outs[3]["output_ids"] == free_alone["output_ids"]  # no mask leaked into it
    assert re.fullmatch(r"-?\d+[ \n]?", outs[4]["text"])  # may end in the space it stopped on
    engine_default.check_integrity()


def test_jump_forward_on_and_off_both_valid(engine_default, jf_off_engine, tokenizer):
    schema = {"type": "object", "properties": {
        "first_name_of_the_person": {"type": "string", "maxLength": 12},
        "last_name_of_the_person": {"type": "string", "maxLength": 12},
        "is_currently_employed": {"type": "boolean"}},
        "required": ["first_name_of_the_person", "last_name_of_the_person",
                     "is_currently_employed"]}
    prompt = chat(tokenizer, "Invent a person and give their details as JSON.")
    params = {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(schema)}
    on = engine_default.generate(prompt, params)
    off = jf_off_engine.generate(prompt, params)
    for out in (on, off):
        jsonschema.validate(json.loads(out["text"]), schema)
    assert on["meta_info"].get("forced_tokens", 0) > 0
    assert off["meta_info"].get("forced_tokens", 0) == 0
    assert engine_default.get_stats()["forced_tokens_total"] > 0


def test_constrained_logprobs_report_masked_distribution(engine_default, tokenizer):
    out = engine_default.generate(chat(tokenizer, "Pick a color."),
                               {"temperature": 0, "max_new_tokens": 4,
                                "choices": ["red", "green"]},
                               return_logprob=True, top_logprobs_num=3)
    assert out["text"] in ("red", "green")
    first_top = out["meta_info"]["output_top_logprobs"][0]
    finite = [tid for lp, tid, _ in first_top if lp > float("-inf")]
    assert finite and all(any(c.startswith(tokenizer.decode([t])) for c in ("red", "green"))
                          for t in finite)  # only tokens that can start a choice


@pytest.mark.parametrize("params, words", [
    ({"json_schema": "{not json"}, "JSON"),
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "schema"),
    ({"regex": "(unclosed"}, "regex"),
    ({"regex": "a", "json_schema": {"type": "string"}}, "constraint"),
])
def test_bad_constraints_raise_before_queueing(engine_default, params, words):
    with pytest.raises(ValueError, match=f"(?i){words}"):
        engine_default.generate("hi", {"max_new_tokens": 4, **params})
    engine_default.check_integrity()


def test_outlines_backend_stays_selectable(tokenizer):
    """grammar_backend="outlines": JSON schema still enforced; ebnf names the backend it needs."""
    from radixlm.runtime.engine import Engine

    with Engine(dtype="float32", max_total_tokens=4096, grammar_backend="outlines",
                log_level="warning") as engine:
        assert type(engine.grammar_backend).__name__ == "OutlinesGrammarBackend"
        out = engine.generate(chat(tokenizer, "Describe Ada Lovelace as JSON."),
                              {"temperature": 0, "max_new_tokens": 64,
                               "json_schema": json.dumps(PERSON)})
        jsonschema.validate(json.loads(out["text"]), PERSON)
        with pytest.raises(ValueError, match="ebnf needs the llguidance grammar backend"):
            engine.generate("x", {"ebnf": 'root ::= "a"'})


def test_json_whitespace_default_style_and_none(engine_default, tokenizer, monkeypatch):
    """By default JSON output is json.dumps's style (``", "`` and ``": "``, nothing else);
    ``whitespace_pattern: ""`` and the server default SGLang's
    ``--constrained-json-disable-any-whitespace`` sets: valid JSON with no whitespace
    outside strings (exactly the compact dump of the value)."""
    import dataclasses

    prompt = chat(tokenizer, "Describe Ada Lovelace as JSON.")
    params = {"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(PERSON)}
    styled = engine_default.generate(prompt, params)["text"]
    value = json.loads(styled)
    jsonschema.validate(value, PERSON)
    assert styled == json.dumps(value, ensure_ascii=False)
    runs = [engine_default.generate(prompt, {**params, "whitespace_pattern": ""})]
    monkeypatch.setattr(engine_default, "config", dataclasses.replace(
        engine_default.config, constrained_json_disable_any_whitespace=True))
    runs.append(engine_default.generate(prompt, params))
    for out in runs:
        value = json.loads(out["text"])
        jsonschema.validate(value, PERSON)
        assert out["text"] == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert runs[0]["text"] == runs[1]["text"]


def test_grammar_backend_made_after_ready_for_the_weights_vocabulary(tiny_model_dir,
                                                                     monkeypatch):
    """The backend is made once, on a thread after the engine is ready, for the vocabulary
    the weights hold (here 64 rows more than the config's); a backend that cannot be made
    leaves the engine serving unconstrained requests and refusing constrained ones by name."""
    import threading

    from radixlm.constraints import create_grammar_backend
    from radixlm.runtime import engine as engine_mod

    sizes, threads, release = [], [], threading.Event()

    def spying(tokenizer, vocab_size, **kw):
        release.wait(30)  # (held until the engine is up: nothing waits for it before)
        sizes.append(vocab_size)
        threads.append(threading.current_thread().name)
        return create_grammar_backend(tokenizer, vocab_size=vocab_size, **kw)

    monkeypatch.setattr("radixlm.constraints.create_grammar_backend", spying)

    from radixlm.runtime.model_runner import ModelRunner

    class PaddedRunner(ModelRunner):  # weights with a head of 64 more rows
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.vocab_size += 64

    monkeypatch.setattr("radixlm.runtime.model_runner.ModelRunner", PaddedRunner)
    with engine_mod.Engine(str(tiny_model_dir), log_level="warning", dtype="float32",
                           max_total_tokens=1024) as engine:
        out = engine.generate("Hello", {"max_new_tokens": 2, "temperature": 0})
        assert out["meta_info"]["completion_tokens"] == 2 and sizes == []
        release.set()
        out = engine.generate("Hello", {"max_new_tokens": 4, "regex": "[ab]+"})
        assert set(out["text"]) <= {"a", "b"} and out["text"]
        assert sizes == [engine.hf_config.vocab_size + 64] and threads == ["radixlm-setup"]
        assert engine.grammar_backend.vocab_size == engine.runner.vocab_size
        assert engine.scheduler.speculation.grammar_backend is engine.grammar_backend
    monkeypatch.undo()

    def failing(tokenizer, vocab_size, **kw):
        raise ValueError("tokenizer larger than the model's vocabulary (test)")

    monkeypatch.setattr("radixlm.constraints.create_grammar_backend", failing)
    with engine_mod.Engine(str(tiny_model_dir), log_level="warning", dtype="float32",
                           max_total_tokens=1024) as engine:
        assert engine.grammar_backend is None
        out = engine.generate("Hello", {"max_new_tokens": 2, "temperature": 0})
        assert out["meta_info"]["completion_tokens"] == 2
        with pytest.raises(ValueError, match="larger than the model's vocabulary"):
            engine.generate("Hello", {"max_new_tokens": 2, "regex": "[ab]+"})
