"""The Ollama API on the shared real server (SmolLM2-135M-Instruct), through the official
`ollama` client: list / show / ps describe the served GGUF; at temperature 0 a chat answers
the same text and counts streamed and not, the same as the Chat Completions route, and
`/api/generate` the same for the same user turn; a raw prompt is the /v1/completions
text; `format` with a JSON schema gives JSON that validates; one that does not compile is
a 400 naming `format`; `think` on a model without a reasoning parser is a 400; `embed`
answers the vectors of `/v1/embeddings`, similar sentences closer than unrelated ones, an
input over the context truncated unless told not to."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import ollama
import openai
import pytest

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "Name a colour of the sky."}]
GREEDY = {"temperature": 0, "num_predict": 12}
TEXTS = ["The cat sat on the mat.", "How do I bake bread at home?"]
# (a, b): b says what a says in other words; a pair is closer than any a and another b
PAIRS = [("The cat sat on the mat.", "A cat was sitting on the mat."),
         ("How do I bake bread at home?", "What is a good recipe for homemade bread?"),
         ("The stock market fell sharply today.", "Share prices dropped steeply this afternoon.")]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(real_server) -> ollama.Client:
    return ollama.Client(host=real_server.url, timeout=120)


@pytest.fixture(scope="module")
def one_shot(client: ollama.Client) -> ollama.ChatResponse:
    return client.chat(model=MODEL, messages=QUESTION, options=GREEDY)


def test_list_show_ps_describe_the_served_model(client: ollama.Client, real_server) -> None:
    [listed] = client.list().models
    assert listed.model == f"{MODEL}:latest" and listed.size > 50_000_000
    assert (listed.details.format, listed.details.family) == ("gguf", "llama")
    assert listed.details.parameter_size.endswith("M")
    shown = client.show(MODEL)
    ctx = real_server.CONTEXT
    assert shown.modelinfo["llama.context_length"] == ctx
    assert 100e6 < shown.modelinfo["general.parameter_count"] < 170e6
    assert "im_start" in shown.template and shown.capabilities == ["completion", "tools"]
    [loaded] = client.ps().models
    assert (loaded.model, loaded.context_length, loaded.digest) == (listed.model, ctx,
                                                                     listed.digest)


def test_chat_streamed_equals_one_shot_and_the_chat_route(
        client: ollama.Client, one_shot: Any, real_server) -> None:
    assert one_shot.message.content.strip() and one_shot.done
    parts = list(client.chat(model=MODEL, messages=QUESTION, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == one_shot.message.content
    last = parts[-1]
    assert [p.done for p in parts].count(True) == 1 and last.done
    assert (last.done_reason, last.prompt_eval_count, last.eval_count) == (
        one_shot.done_reason, one_shot.prompt_eval_count, one_shot.eval_count)
    chat = openai.OpenAI(base_url=real_server.url + "/v1", api_key="x", max_retries=0)
    r = chat.chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                     max_tokens=GREEDY["num_predict"])
    assert r.choices[0].message.content == one_shot.message.content
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        one_shot.prompt_eval_count, one_shot.eval_count)
    assert r.choices[0].finish_reason == one_shot.done_reason
    for p in (one_shot, last):  # nanoseconds, the engine's share within the total
        assert p.prompt_eval_duration > 0 and p.eval_duration > 0
        assert p.total_duration >= p.prompt_eval_duration + p.eval_duration - 5_000_000


def test_generate_templated_and_raw(client: ollama.Client, one_shot: Any,
                                    real_server) -> None:
    g = client.generate(model=MODEL, prompt=QUESTION[0]["content"], options=GREEDY)
    assert g.response == one_shot.message.content
    assert (g.prompt_eval_count, g.eval_count) == (one_shot.prompt_eval_count,
                                                   one_shot.eval_count)
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 6})
    completions = openai.OpenAI(base_url=real_server.url + "/v1", api_key="x", max_retries=0)
    r = completions.completions.create(model="m", prompt="The capital of France is",
                                       temperature=0, max_tokens=6)
    assert raw.response == r.choices[0].text and "Paris" in raw.response
    assert raw.prompt_eval_count == r.usage.prompt_tokens < 10
    assert (raw.eval_count, raw.done_reason) == (6, "length")


@pytest.mark.parametrize("stream", [False, True])
def test_format_schema_gives_json_that_validates(client: ollama.Client, stream: bool) -> None:
    out = client.chat(model=MODEL, messages=[{"role": "user", "content": "A city in Spain, "
                                              "as JSON."}], format=CITY, stream=stream,
                      options={"temperature": 0, "num_predict": 40})
    text = "".join(p.message.content for p in out) if stream else out.message.content
    jsonschema.validate(json.loads(text), CITY)


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_that_does_not_compile_is_a_400_naming_format(client: ollama.Client,
                                                               stream: bool) -> None:
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}
    with pytest.raises(ollama.ResponseError) as err:
        out = client.chat(model=MODEL, messages=QUESTION, format=bad, stream=stream,
                          options={"num_predict": 4})
        list(out) if stream else None
    assert err.value.status_code == 400 and err.value.error.startswith("format:")


def test_think_needs_a_reasoning_parser(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=MODEL, messages=QUESTION, think=True)
    assert err.value.status_code == 400 and err.value.error.startswith("think:")
    off = client.chat(model=MODEL, messages=QUESTION, think=False, options=GREEDY)
    assert off.message.thinking is None and off.message.content


def test_embed_answers_the_vectors_of_v1_embeddings(client: ollama.Client, real_server) -> None:
    v1 = openai.OpenAI(base_url=real_server.url + "/v1", api_key="x", max_retries=0)
    expected = [d.embedding for d in v1.embeddings.create(
        model="m", input=TEXTS, encoding_format="float").data]
    one = client.embed(model=MODEL, input=TEXTS[0])
    np.testing.assert_allclose(one.embeddings[0], expected[0], atol=1e-5)
    both = client.embed(model=MODEL, input=TEXTS)
    np.testing.assert_allclose(both.embeddings, expected, atol=1e-5)
    usage = v1.embeddings.create(model="m", input=TEXTS).usage
    assert both.prompt_eval_count == usage.prompt_tokens and both.model == f"{MODEL}:latest"
    assert both.total_duration >= both.load_duration > 0
    legacy = client.embeddings(model=MODEL, prompt=TEXTS[1]).embedding
    np.testing.assert_allclose(legacy, expected[1], atol=1e-5)
    short = client.embed(model=MODEL, input=TEXTS[0], dimensions=32).embeddings[0]
    full = np.asarray(expected[0][:32])
    np.testing.assert_allclose(short, full / np.linalg.norm(full), atol=1e-5)


def test_embed_similar_sentences_are_closer_than_unrelated(client: ollama.Client) -> None:
    out = client.embed(model=MODEL, input=[t for pair in PAIRS for t in pair]).embeddings
    a, b = np.asarray(out[0::2]), np.asarray(out[1::2])
    sims = a @ b.T  # unit vectors: cosine similarities
    for i in range(len(PAIRS)):
        assert sims[i, i] > max(sims[i, j] for j in range(len(PAIRS)) if j != i), sims


def test_embed_truncates_to_the_context_unless_told_not_to(client: ollama.Client,
                                                           real_server) -> None:
    long = "one two three four five six seven eight nine ten " * 120  # > 512 tokens
    r = client.embed(model=MODEL, input=long)
    assert r.prompt_eval_count == real_server.CONTEXT and len(r.embeddings[0]) == 576
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model=MODEL, input=["short", long], truncate=False)
    assert err.value.status_code == 400 and err.value.error.startswith("input[1]: has ")
