"""`POST /v1/embeddings` through the official `openai` client and SGLang's `POST /encode`, on
a real server on loopback (uvicorn serving the session's default engine on the embedded
model, with an API key, a queue bound and a body cap; one per module). What the server
answers is what `Engine.encode` computes (tests/test_embeddings.py compares that with
transformers), bit for bit: float32 values sent as JSON numbers or as base64, which the
client asks for by default and decodes. (The default engine is batch-invariant, so a text
embedded alone or in a batch, by the server or directly, is the same bits by
construction; fp32 activations sum by step size and would be equal only by luck.) Both
routes take generation's admission: the API key (401), the queue bound (429), the body cap
(413) and an abort when the client leaves.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from server_fakes import ThreadServer, wait_until

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings

KEY = "sk-embed-test"
QUEUE = 4  # the server's bound on queued requests
BODY_CAP = 256 * 1024
TEXTS = ["The cat sat on the mat.", "How do I bake bread at home?"]


@pytest.fixture(scope="module")
def server(engine_default) -> Iterator[ThreadServer]:
    settings = ServerSettings(api_key=KEY, max_queued_requests=QUEUE, max_body_bytes=BODY_CAP)
    with ThreadServer(create_app(engine_default, settings)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def expected(engine_default) -> list[list[float]]:
    return [out["embedding"] for out in engine_default.encode(TEXTS)]


def _post(server, path: str, body: dict, key: str | None = KEY,
          timeout: float = 60) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=timeout)


def test_string_list_and_usage(client, expected, engine_default):
    one = client.embeddings.create(model="smol", input=TEXTS[0], encoding_format="float")
    assert one.object == "list" and one.model == "smol"
    assert one.data[0].object == "embedding" and one.data[0].index == 0
    assert one.data[0].embedding == expected[0]
    batch = client.embeddings.create(model="smol", input=TEXTS, encoding_format="float",
                                     user="u1")
    assert [d.index for d in batch.data] == [0, 1]
    assert [d.embedding for d in batch.data] == expected
    tokens = sum(len(engine_default.tokenizer.encode(t, add_special_tokens=False)) for t in TEXTS)
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == tokens


def test_base64_is_the_clients_default_and_decodes_to_the_floats(client, server, expected):
    default = client.embeddings.create(model="m", input=TEXTS)  # the client sends base64
    assert [list(map(float, d.embedding)) for d in default.data] == expected
    raw = _post(server, "/v1/embeddings", {"input": TEXTS[1], "encoding_format": "base64"})
    data = raw.json()["data"][0]["embedding"]
    assert isinstance(data, str)
    assert np.frombuffer(base64.b64decode(data), dtype="<f4").tolist() == expected[1]


def test_token_ids_and_dimensions(client, engine_default, expected):
    ids = [engine_default.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    assert client.embeddings.create(model="m", input=ids[0], encoding_format="float"
                                    ).data[0].embedding == expected[0]
    both = client.embeddings.create(model="m", input=ids, encoding_format="float")
    assert [d.embedding for d in both.data] == expected
    short = client.embeddings.create(model="m", input=TEXTS[0], dimensions=24)
    vec = np.asarray(short.data[0].embedding, dtype=np.float64)
    full = np.asarray(expected[0], dtype=np.float64)
    assert vec.shape == (24,)
    np.testing.assert_allclose(vec, full[:24] / np.linalg.norm(full[:24]), atol=1e-6)


@pytest.mark.parametrize("body, param, words", [
    ({"input": ""}, "input", "'input' is an empty string"),
    ({"input": []}, "input", "'input' is empty"),
    ({"input": ["a", ""]}, "input", "'input[1]' is an empty string"),
    ({"input": [[1, 2], []]}, "input", "'input[1]' is an empty list of token ids"),
    ({"input": "x", "dimensions": 0}, "dimensions", "'dimensions' must be between 1 and"),
    ({"input": "x", "dimensions": 577}, "dimensions", "got 577"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "encoding_format"),
    ({"input": [1.5]}, "input", "input"),
])
def test_bad_bodies_are_400s_naming_the_field(client, body, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="m", **body)
    error = info.value.body
    assert info.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"]


def test_input_over_the_context_is_a_400(client, engine_default):
    ctx = engine_default.context_len
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="m", input=[5] * (ctx + 1))
    assert info.value.body["param"] == "input"
    assert info.value.body["code"] == "context_length_exceeded"
    assert f"{ctx + 1} tokens" in info.value.body["message"]


def test_encode_answers_like_sglang(server, expected, engine_default):
    one = _post(server, "/encode", {"text": TEXTS[0], "rid": "e1"}).json()
    assert one["embedding"] == expected[0]
    assert one["meta_info"]["id"] == "e1" and one["meta_info"]["prompt_tokens"] > 0
    batch = _post(server, "/encode", {"text": TEXTS}).json()
    assert [out["embedding"] for out in batch] == expected
    ids = [engine_default.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    assert _post(server, "/encode", {"input_ids": ids[1]}).json()["embedding"] == expected[1]
    assert [o["embedding"] for o in _post(server, "/encode", {"input_ids": ids}).json()] \
        == expected
    for body, param in (({"text": "a", "input_ids": [1]}, "text"), ({}, "text"),
                        ({"text": ""}, "text"), ({"input_ids": []}, "input_ids")):
        r = _post(server, "/encode", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("path, body", [("/v1/embeddings", {"input": "hi"}),
                                        ("/encode", {"text": "hi"})])
def test_admission_key_queue_bound_and_body_cap(server, engine_default, path, body):
    assert _post(server, path, body, key=None).status_code == 401
    assert _post(server, path, body, key="wrong").status_code == 401
    held = engine_default.reserve(QUEUE)  # the waiting queue is full
    try:
        r = _post(server, path, body)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
    finally:
        held.release()
    assert _post(server, path, body).status_code == 200
    big = {**body, ("input" if "input" in body else "text"): "word " * (BODY_CAP // 4)}
    r = _post(server, path, big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("path, body", [("/v1/embeddings", {"input": ["a", "b"]}),
                                        ("/encode", {"text": ["a", "b"], "rid": ["r1", "r2"]})])
def test_client_leaving_aborts_the_requests(server, engine_default, monkeypatch, path, body):
    started, aborted = [], []
    gate = threading.Event()

    async def slow_encode(**kwargs):  # a prefill that outlasts the client
        started.append(kwargs["rid"])
        while not gate.is_set():
            await asyncio.sleep(0.01)
        raise AssertionError("not aborted")

    monkeypatch.setattr(engine_default, "async_encode", slow_encode)
    monkeypatch.setattr(engine_default, "abort", aborted.append)
    try:
        with pytest.raises(httpx.ReadTimeout):
            _post(server, path, body, timeout=1.0)
        wait_until(lambda: len(aborted) == 2, "the server to abort both requests")
    finally:
        gate.set()
    assert sorted(aborted) == sorted(started)
    if "rid" in body:
        assert sorted(aborted) == ["r1", "r2"]
