"""OpenAI-compatible API through the real `openai` client, against the fake engine served by
uvicorn on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from server_fakes import FakeEngine, ThreadServer

from radixlm.server.app import create_app


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeEngine, ThreadServer]]:
    fake = FakeEngine(context_len=256)
    with ThreadServer(create_app(fake)) as server:
        yield fake, server


@pytest.fixture
def fake(served: tuple[FakeEngine, ThreadServer]) -> FakeEngine:
    return served[0]


@pytest.fixture
def client(served: tuple[FakeEngine, ThreadServer]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].base_url + "/v1", api_key="unused", max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]


def test_chat_completion(client: openai.OpenAI, fake: FakeEngine) -> None:
    out = client.chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0, stop=["d"])
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == "abc"
    assert out.choices[0].finish_reason == "stop"
    expected_ids = fake.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True)["input_ids"]
    assert fake.calls[-1]["input_ids"] == expected_ids
    assert fake.calls[-1]["sampling_params"]["stop"] == ["d"]
    assert out.usage.prompt_tokens == len(expected_ids)
    assert out.usage.completion_tokens == 4  # the stop string's token was generated
    assert out.usage.total_tokens == len(expected_ids) + 4
    assert out.usage.prompt_tokens_details.cached_tokens == 2


def test_chat_max_completion_tokens_and_default_is_rest_of_context(
        client: openai.OpenAI, fake: FakeEngine) -> None:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                   max_completion_tokens=2, max_tokens=9)
    assert fake.calls[-1]["sampling_params"]["max_new_tokens"] == 2
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    prompt_len = len(fake.calls[-1]["input_ids"])
    assert fake.calls[-1]["sampling_params"]["max_new_tokens"] == 256 - prompt_len


def test_chat_n_seed_logprobs(client: openai.OpenAI, fake: FakeEngine) -> None:
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2, n=3, seed=11,
        logprobs=True, top_logprobs=2)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c["sampling_params"]["seed"] for c in fake.calls[-3:]] == [11, 12, 13]
    lp = out.choices[0].logprobs.content
    assert [t.token for t in lp] == ["a", "b"]
    assert lp[0].logprob == -0.5 and lp[0].bytes == [97]
    assert [t.token for t in lp[0].top_logprobs] == ["a", "b"]
    assert out.usage.completion_tokens == 6
    assert out.usage.prompt_tokens == len(fake.calls[-1]["input_ids"])  # counted once


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "abc"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_completions_batch_n_logprobs(client: openai.OpenAI, fake: FakeEngine) -> None:
    out = client.completions.create(model="m", prompt=["hi", "yo"], max_tokens=2, n=2,
                                    logprobs=1)
    assert out.object == "text_completion"
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(c.text == "ab" for c in out.choices)
    lp = out.choices[0].logprobs
    assert lp.tokens == ["a", "b"] and lp.token_logprobs == [-0.5, -0.5]
    assert lp.text_offset == [0, 1] and lp.top_logprobs == [{"a": -0.5}, {"b": -0.5}]
    assert out.usage.prompt_tokens == 4 and out.usage.completion_tokens == 8
    assert [c["text"] for c in fake.calls[-4:]] == ["hi", "hi", "yo", "yo"]


def test_completions_token_prompt_echo_and_extras(client: openai.OpenAI,
                                                  fake: FakeEngine) -> None:
    out = client.completions.create(
        model="m", prompt=[104, 105], max_tokens=3, echo=True,
        extra_body={"choices": ["yes", "no"], "top_k": 5, "min_tokens": 1})
    assert out.choices[0].text == "hiyes"
    sent = fake.calls[-1]
    assert sent["input_ids"] == [104, 105]
    assert sent["sampling_params"]["choices"] == ["yes", "no"]
    assert sent["sampling_params"]["top_k"] == 5 and sent["sampling_params"]["min_new_tokens"] == 1


def test_completions_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="m", prompt="hi", max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "abcd"
    assert chunks[-1].usage.prompt_tokens == 2 and chunks[-1].usage.completion_tokens == 4


def test_response_format_maps_to_json_schema(client: openai.OpenAI, fake: FakeEngine) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    assert json.loads(fake.calls[-1]["sampling_params"]["json_schema"]) == schema
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                   max_tokens=1, response_format={"type": "json_object"})
    assert json.loads(fake.calls[-1]["sampling_params"]["json_schema"]) == {"type": "object"}


@pytest.mark.parametrize("kwargs, needle", [
    ({"temperature": 5}, "temperature"),
    ({"extra_body": {"frobnicate": 1}}, "Unrecognized request argument supplied: frobnicate"),
    ({"logit_bias": {"x": 2.0}}, "logit_bias"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"extra_body": {"regex": "a+", "choices": ["a"]}}, "at most one constraint"),
    ({"messages": [{"role": "user", "content": "x" * 300}]}, "context length"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_chat_errors_in_openai_shape(client: openai.OpenAI, kwargs: dict, needle: str) -> None:
    args = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
            **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**args)
    err = info.value.body
    assert needle in err["message"]
    assert err["type"] == "invalid_request_error" and "param" in err and "code" in err


def test_unsupported_completion_field_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="hi", max_tokens=1, suffix="x")
    assert "suffix" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="hi", max_tokens=1, echo=True, logprobs=1,
                                  stream=True)
    assert "'echo' together with 'logprobs'" in info.value.body["message"]
