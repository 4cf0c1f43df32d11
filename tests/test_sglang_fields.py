"""SGLang's request fields on the engine (tiny random model) and the HTTP layer (fake engine):
`sampling_seed`, `logit_bias`, `stream_interval`, refused fields named, `--chat-template`."""

from __future__ import annotations

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.sampling_params import SamplingParams

PROMPT = [300, 301, 302, 303, 304]


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("tpl") / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                chat_template=str(template), log_level="warning") as e:
        yield e


def test_sampling_seed_is_seed(engine) -> None:
    params = {"temperature": 50.0, "max_new_tokens": 12, "ignore_eos": True}  # near uniform
    a = engine.generate(input_ids=PROMPT, sampling_params={**params, "sampling_seed": 11})
    b = engine.generate(input_ids=PROMPT, sampling_params={**params, "seed": 11})
    c = engine.generate(input_ids=PROMPT, sampling_params={**params, "sampling_seed": 12})
    assert a["output_ids"] == b["output_ids"] != c["output_ids"]
    with pytest.raises(ValueError, match="sampling_seed and seed"):
        SamplingParams.from_dict({"sampling_seed": 1, "seed": 2})


def test_logit_bias_moves_the_greedy_choice(engine) -> None:
    params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    plain = engine.generate(input_ids=PROMPT, sampling_params=params)["output_ids"]
    target = next(t for t in range(1000, 2000) if t not in plain)
    biased = engine.generate(input_ids=PROMPT, sampling_params={
        **params, "logit_bias": {str(target): 100.0}})["output_ids"]
    assert biased == [target] * 6
    banned = engine.generate(input_ids=PROMPT, sampling_params={
        **params, "logit_bias": {str(plain[0]): -100.0}})["output_ids"]
    assert banned[0] != plain[0]
    # the bias is per request: a neighbour in the same batch is untouched
    outs = engine.generate(input_ids=[PROMPT, PROMPT], sampling_params=[
        {**params, "logit_bias": {str(target): 100.0}}, params])
    assert [o["output_ids"] for o in outs] == [[target] * 6, plain]
    with pytest.raises(ValueError, match="outside"):
        engine.generate(input_ids=PROMPT, sampling_params={"logit_bias": {"99999999": 1}})
    with pytest.raises(ValueError, match="logit_bias key 'a'"):
        engine.generate(input_ids=PROMPT, sampling_params={"logit_bias": {"a": 1}})


def test_stream_interval(engine) -> None:
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    every = list(engine.generate(input_ids=PROMPT, sampling_params=params, stream=True))
    sparse = list(engine.generate(input_ids=PROMPT, sampling_params={
        **params, "stream_interval": 5}, stream=True))
    assert sparse[-1]["output_ids"] == every[-1]["output_ids"]
    # chunks at 5 and 10 tokens, then the final one
    assert [len(c["output_ids"]) for c in sparse] == [5, 10, 12]
    assert len(every) > len(sparse)


def test_unsupported_sampling_fields_are_named(engine) -> None:
    with pytest.raises(ValueError, match="'custom_params' is not supported"):
        engine.generate(input_ids=PROMPT, sampling_params={"custom_params": "x"})


@pytest.mark.parametrize("name", ["ebnf", "structural_tag"])
def test_bad_grammar_fields_are_named(engine, name: str) -> None:
    """ebnf / structural_tag are served by the llguidance backend (issue #12); a bad value
    is a ValueError naming the field."""
    with pytest.raises(ValueError, match=name):
        engine.generate(input_ids=PROMPT, sampling_params={name: "x"})


def test_chat_template_override_reaches_the_tokenizer(engine) -> None:
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                               add_generation_prompt=True, tokenize=False)
    assert ids == "<user>hi<assistant>"
    from radixlm.lang.backend.runtime_engine import Runtime

    template = Runtime(engine).get_chat_template()
    assert template.segments("user")[0] == "<user>"


def test_named_chatml_matches_smollm2s_own_template(tokenizer) -> None:
    from radixlm.formats.chat_templates import NAMED

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"}]
    own = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    named = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                          chat_template=NAMED["chatml"])
    assert named == own


def test_http_fields_reach_the_engine() -> None:
    import openai
    from fastapi.testclient import TestClient
    from server_fakes import FakeEngine, ThreadServer

    from radixlm.server.app import create_app

    fake = FakeEngine(context_len=256)
    app = create_app(fake)
    client = TestClient(app)
    r = client.post("/generate", json={"text": "hi", "priority": 3, "sampling_params": {
        "sampling_seed": 4, "n": 2, "logit_bias": {"5": 1.5}, "max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    sent = fake.calls[-2:]
    assert [c["sampling_params"]["seed"] for c in sent] == [4, 5]  # seed + j, as for `seed`
    assert all(c["priority"] == 3 and c["sampling_params"]["logit_bias"] == {"5": 1.5}
               for c in sent)
    with ThreadServer(create_app(fake)) as server:
        oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                   max_tokens=1, logit_bias={"7": -2},
                                   extra_body={"priority": 5})
        assert fake.calls[-1]["sampling_params"]["logit_bias"] == {"7": -2.0}
        assert fake.calls[-1]["priority"] == 5
