"""Every primitive on the real default model (SmolLM2-135M-Instruct, greedy), twice: through the
in-process Engine (`Runtime`) and through a live `radixlm serve` (`RuntimeEndpoint`, on
conftest's shared server).

Assertions are on structure and on outputs a 135M instruct model gets reliably: constrained
ints, choices, regex matches, valid JSON, cache hits, streaming that adds up.
"""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel

import radixlm as sgl
from radixlm.lang.backend.base import BackendError

KV_TOKENS = 16384
LONG_PREFIX = (
    "You are a careful assistant. Read the facts, then answer in as few words as possible.\n"
    "Facts: The sky on a clear day is blue. Grass is green. Snow is white. A dog has four "
    "legs. A spider has eight legs. Paris is the capital of France. Rome is the capital of "
    "Italy. Water boils at 100 degrees Celsius at sea level.\n"
)


@pytest.fixture(scope="module", params=["engine", "endpoint"])
def backend(request):
    if request.param == "engine":
        runtime = sgl.Runtime(max_total_tokens=KV_TOKENS, timeout=120)
        yield runtime
        runtime.shutdown()
        return
    server = request.getfixturevalue("real_server")  # conftest's `radixlm serve`
    endpoint = sgl.RuntimeEndpoint(server.url, timeout=120)
    endpoint.url = server.url
    yield endpoint
    endpoint.shutdown()


def greedy(program, backend, **kwargs):
    state = program.run(backend=backend, temperature=0, **kwargs)
    assert state.error() is None, state.error()
    return state


@sgl.function
def capital_chat(s, country):
    s += sgl.user(f"What is the capital of {country}? Answer in one short sentence.")
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, stop="\n"))
    s += sgl.user("What is 3 + 4?")
    s += sgl.assistant("3 + 4 = " + sgl.gen_int("sum", max_tokens=4))


def test_multi_turn_chat_and_gen_int(backend):
    state = greedy(capital_chat, backend, country="France")
    assert "Paris" in state["answer"]
    assert int(state["sum"]) == 7
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[0]["content"].startswith("You are a helpful AI assistant")
    # the prompt text is exactly the model's own chat template applied to the messages
    assert state.text() == backend.get_chat_template().render(state.messages())
    meta = state.get_meta_info("sum")
    assert meta["cached_tokens"] > 0 and meta["completion_tokens"] <= 4


def test_chat_template_matches_transformers(backend):
    from radixlm.runtime.weights import load_tokenizer

    tok = load_tokenizer()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert backend.get_chat_template().render(msgs) == tok.apply_chat_template(
        msgs, tokenize=False)


@sgl.function
def sky(s, method=sgl.token_length_normalized):
    s += sgl.user(LONG_PREFIX + "What colour is the sky on a clear day?")
    s += sgl.assistant("The sky is " + sgl.select("colour", ["green", "blue", "red"],
                                                   choices_method=method))


@pytest.mark.parametrize("method", [sgl.token_length_normalized, sgl.greedy_token_selection,
                                    sgl.unconditional_likelihood_normalized])
def test_select_methods(backend, method):
    state = greedy(sky, backend, method=method)
    assert state["colour"] == "blue"
    assert state.text().endswith("The sky is blue<|im_end|>\n")
    meta = state.get_meta_info("colour")
    assert len(meta["normalized_prompt_logprobs"]) == 3
    assert all(len(t) >= 1 for t in meta["input_token_logprobs"])
    # all choices went out in one batched request that shared the prompt's prefix
    assert len(meta["prompt_tokens"]) == 3


def test_regex_and_json(backend):
    class City(BaseModel):
        name: str
        country: str

    @sgl.function
    def structured(s):
        s += sgl.user("Give the date of the Moon landing in the form YYYY-MM-DD.")
        s += sgl.assistant(sgl.gen("date", regex=r"(19|20)[0-9]{2}-[0-9]{2}-[0-9]{2}",
                                   max_tokens=16))
        s += sgl.user("Describe Paris as JSON with fields name and country.")
        s += sgl.assistant(sgl.gen("city", json_schema=City, max_tokens=48))

    state = greedy(structured, backend)
    assert re.fullmatch(r"(19|20)[0-9]{2}-[0-9]{2}-[0-9]{2}", state["date"])
    city = City.model_validate(json.loads(state["city"]))
    assert city.name


def test_fork_children_share_parent_prefix(backend):
    @sgl.function
    def drafts(s):
        s += sgl.user(LONG_PREFIX + "Name one fact from the list.")
        s += sgl.assistant_begin()
        forks = s.fork(3)
        forks += lambda i: f"Fact {i + 1}:" + sgl.gen("fact", max_tokens=6, stop="\n")
        forks.join()
        s += "Done." + sgl.assistant_end()

    state = greedy(drafts, backend)
    assert len(state["fact"]) == 3 and all(isinstance(f, str) for f in state["fact"])
    for meta in state.get_meta_info("fact"):
        # the parent's text was committed to the cache before the fork: only the fork's
        # own few tokens are prefilled
        assert meta["cached_tokens"] >= meta["prompt_tokens"] - 8, meta


@sgl.function
def few_shot_sum(s, question):
    s += sgl.system(LONG_PREFIX)
    s += sgl.user("Add the numbers. 1 + 1 = 2. 2 + 3 = 5. 10 + 4 = 14. Now: " + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=3))


def test_run_batch_warms_cache(backend):
    assert backend.flush_cache()
    prefix = few_shot_sum.trace_prefix(backend=backend)
    assert prefix.endswith("Now: ") and LONG_PREFIX in prefix
    stats0 = backend.engine.get_stats() if hasattr(backend, "engine") else None
    questions = ["2 + 2", "3 + 4", "5 + 1", "6 + 2"]
    states = few_shot_sum.run_batch([{"question": q} for q in questions], backend=backend,
                                    temperature=0, progress_bar=False)
    assert all(s.error() is None for s in states)
    assert all(isinstance(s["answer"], str) and s["answer"] for s in states)
    for s in states:
        meta = s.get_meta_info("answer")
        # the traced prefix was cached before the batch: every program hits it
        assert meta["cached_tokens"] >= meta["prompt_tokens"] - 16, meta
    if stats0 is not None:
        stats = backend.engine.get_stats()
        cached = stats["cached_tokens_total"] - stats0["cached_tokens_total"]
        prompt = stats["prompt_tokens_total"] - stats0["prompt_tokens_total"]
        assert cached / prompt > 0.6, (cached, prompt)


def test_streaming_adds_up(backend):
    @sgl.function
    def story(s):
        s += sgl.user("Write one sentence about a cat.")
        s += sgl.assistant(sgl.gen("story", max_tokens=10))

    state = story.run(backend=backend, temperature=0, stream=True)
    pieces = list(state.text_iter("story"))
    assert state.error() is None
    assert len(pieces) > 2
    assert "".join(pieces) == state["story"] and state["story"]
    # the whole-text stream of a second run is incremental too and ends in the final text
    state = story.run(backend=backend, temperature=0, stream=True)
    assert "".join(state.text_iter()) == state.text()


def test_logprobs_and_stop(backend):
    @sgl.function
    def count(s):
        s += "1, 2, 3, 4," + sgl.gen("more", max_tokens=8, stop=",", return_logprob=True,
                                     top_logprobs_num=2)

    state = greedy(count, backend)
    assert state["more"].strip() == "5"
    meta = state.get_meta_info("more")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert len(meta["output_top_logprobs"][0]) == 2


def test_backend_error_is_state_error(backend):
    @sgl.function
    def rejected(s):
        s += "hello" + sgl.gen("x", max_tokens=2, top_p=2.0)
        s += sgl.gen("y", max_tokens=1)

    state = rejected.run(backend=backend)
    err = state.error()
    assert isinstance(err, (ValueError, BackendError))
    assert "top_p" in str(err)
    with pytest.raises(sgl.ProgramError):
        state["y"]


@pytest.mark.parametrize("backend", ["endpoint"], indirect=True)  # needs the HTTP server
def test_openai_backend_against_server(backend):
    oai = sgl.OpenAI("smollm2-135m-instruct", base_url=backend.url + "/v1")

    @sgl.function
    def chat(s):
        s += sgl.user("What is the capital of France? Answer in one word.")
        s += sgl.assistant(sgl.gen("city", max_tokens=8))
        s += sgl.user("Is Paris in Europe? Answer yes or no.")
        s += sgl.assistant(sgl.select("yn", ["yes", "no"]))

    state = chat.run(backend=oai, temperature=0)
    assert state.error() is None, state.error()
    assert "Paris" in state["city"]
    assert state["yn"] == "yes"


@pytest.mark.parametrize("backend", ["endpoint"], indirect=True)  # needs the HTTP server
def test_openai_completion_model_against_server(backend):
    oai = sgl.OpenAI("smollm2-135m-instruct", base_url=backend.url + "/v1",
                     is_chat_model=False)

    @sgl.function
    def complete(s):
        s += "The capital of Italy is Rome. The capital of France is"
        s += sgl.gen("city", max_tokens=3, stop=[".", "\n"])
        s += "\nQ: Is Paris in Europe?\nA:" + sgl.select("yn", [" yes", " no"])

    state = complete.run(backend=oai, temperature=0)
    assert state.error() is None, state.error()
    assert state["city"].strip() == "Paris"
    assert state["yn"] == " yes"


@sgl.function
def cat_card(s):
    s += sgl.user("Describe a cat as JSON with a name, many tags and an age.")
    s += sgl.assistant(sgl.gen("card", max_tokens=20, json_schema={
        "type": "object", "properties": {
            "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
            "age": {"type": "integer"}}, "required": ["name", "tags", "age"]},
        complete_within_max_tokens=True))


def test_gen_closes_its_document_within_max_tokens(backend):
    """`gen(complete_within_max_tokens=True)`: the JSON parses within 20 tokens, where the
    model alone runs past them (sampled at temperature 1, three times)."""
    for _ in range(3):
        state = cat_card.run(backend=backend, temperature=1.0)
        assert state.error() is None, state.error()
        card = json.loads(state["card"])
        assert set(card) == {"name", "tags", "age"} and isinstance(card["age"], int)
    with pytest.raises(ValueError, match="complete_within_max_tokens needs a constraint"):
        sgl.gen("x", max_tokens=8, complete_within_max_tokens=True)
