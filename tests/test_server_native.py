"""Native (SGLang-compatible) API against the fake engine: shapes, batching, streaming,
logprobs, validation."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeEngine

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(context_len=64)


@pytest.fixture
def client(fake: FakeEngine) -> TestClient:
    return TestClient(create_app(fake, ServerSettings()))


def sse_events(text: str) -> list[str]:
    """The data payloads of an SSE body, in order."""
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def test_generate_single_shape(client: TestClient, fake: FakeEngine) -> None:
    r = client.post("/generate", json={"text": "hi", "rid": "r1",
                                       "sampling_params": {"max_new_tokens": 5}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] == "abcde"
    assert body["output_ids"] == [97, 98, 99, 100, 101]
    meta = body["meta_info"]
    assert meta["id"] == "r1"
    assert meta["prompt_tokens"] == 2 and meta["completion_tokens"] == 5
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert fake.calls[-1]["text"] == "hi" and fake.calls[-1]["rid"] == "r1"


def test_generate_uses_request_id_as_rid(client: TestClient) -> None:
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert r.json()["meta_info"]["id"] == r.headers["x-request-id"]


def test_generate_batch_input_ids_and_n(client: TestClient, fake: FakeEngine) -> None:
    r = client.post("/generate", json={
        "input_ids": [[104, 105], [121, 111, 33]], "rid": ["a", "b"],
        "sampling_params": [{"max_new_tokens": 2, "n": 2, "seed": 7},
                            {"max_new_tokens": 3}]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["meta_info"]["id"] for o in out] == ["a-0", "a-1", "b"]
    assert [o["text"] for o in out] == ["ab", "ab", "abc"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [2, 2, 3]
    seeds = [c["sampling_params"].get("seed") for c in fake.calls]
    assert seeds == [7, 8, None]
    assert all("n" not in c["sampling_params"] for c in fake.calls)


def test_generate_batch_text_with_string_rid_is_a_prefix(client: TestClient) -> None:
    r = client.post("/generate", json={"text": ["x", "y"], "rid": "job",
                                       "sampling_params": {"max_new_tokens": 1}})
    assert [o["meta_info"]["id"] for o in r.json()] == ["job-0", "job-1"]


def test_generate_stream_cumulative_then_done(client: TestClient) -> None:
    r = client.post("/generate", json={"text": "hi", "stream": True,
                                       "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert texts[:3] == ["a", "ab", "abc"]  # cumulative, as SGLang sends it
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_stream_batch_has_index(client: TestClient) -> None:
    r = client.post("/generate", json={"text": ["p", "q"], "stream": True,
                                       "sampling_params": {"max_new_tokens": 2}})
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    finals = {c["index"]: c["text"] for c in chunks if c["meta_info"]["finish_reason"]}
    assert finals == {0: "ab", 1: "ab"}


def test_generate_logprobs(client: TestClient) -> None:
    r = client.post("/generate", json={
        "text": "hey", "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
        "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 2}})
    meta = r.json()["meta_info"]
    assert meta["input_token_logprobs"] == [[None, 104, "h"], [-1.0, 101, "e"],
                                            [-1.0, 121, "y"]]
    assert meta["output_token_logprobs"] == [[-0.5, 97, "a"], [-0.5, 98, "b"]]
    assert [len(row) for row in meta["output_top_logprobs"]] == [2, 2]
    r = client.post("/generate", json={"text": "hey", "return_logprob": True,
                                       "logprob_start_len": 1,
                                       "sampling_params": {"max_new_tokens": 1}})
    meta = r.json()["meta_info"]
    assert [e[1] for e in meta["input_token_logprobs"]] == [101, 121]
    assert meta["output_token_logprobs"] == [[-0.5, 97, None]]


def test_generate_accepts_sglang_frontend_fields(client: TestClient, fake: FakeEngine) -> None:
    params = {"max_new_tokens": 0, "n": None, "stop": None, "stop_token_ids": None,
              "stop_regex": None, "min_new_tokens": None, "skip_special_tokens": True,
              "spaces_between_special_tokens": True, "no_stop_trim": False,
              "ignore_eos": False, "temperature": 0.0, "json_schema": None, "regex": None}
    r = client.post("/generate", json={"text": "hi", "sampling_params": params,
                                       "image_data": None, "modalities": None,
                                       "lora_path": None, "conversation_id": "c1",
                                       "return_logprob": None, "logprob_start_len": None,
                                       "top_logprobs_num": None})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "" and r.json()["output_ids"] == []  # prefill only
    sent = fake.calls[-1]["sampling_params"]
    assert sent["max_new_tokens"] == 0 and "n" not in sent and "stop" not in sent


@pytest.mark.parametrize("body, needle", [
    ({"text": "hi", "input_ids": [1]}, "exactly one of 'text' and 'input_ids'"),
    ({"sampling_params": {}}, "exactly one of 'text' and 'input_ids'"),
    ({"text": "hi", "image_data": "x.png"}, "image_data"),
    ({"text": "hi", "some_future_field": 1}, "unknown field(s): some_future_field"),
    ({"text": "hi", "return_entropy": True}, "return_entropy"),
    ({"text": "hi", "routed_dp_rank": 1}, "routed_dp_rank"),
    ({"text": "hi", "modalities": ["image"]}, "modalities"),
    ({"text": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": "hi", "sampling_params": {"bogus": 1}}, "bogus"),
    ({"text": "hi", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": 5}, "text"),
    ({"text": "hi", "stream": "maybe"}, "stream"),
    ({"input_ids": []}, "empty"),
])
def test_generate_bad_input_is_400_naming_the_problem(client: TestClient, body: dict,
                                                      needle: str) -> None:
    r = client.post("/generate", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_json_body_without_json_content_type(client: TestClient) -> None:
    r = client.post("/generate", content=b'{"text": "hi", "sampling_params": '
                    b'{"max_new_tokens": 2}}',
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["text"] == "ab"


def test_invalid_json_body_is_400(client: TestClient) -> None:
    r = client.post("/generate", content=b"{not json", headers={"content-type":
                                                                 "application/json"})
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


def test_prompt_longer_than_context_is_400_else_clamped(client: TestClient,
                                                        fake: FakeEngine) -> None:
    r = client.post("/generate", json={"text": "x" * 64})
    assert r.status_code == 400
    assert "context length is 64" in r.json()["error"]["message"]
    r = client.post("/generate", json={"text": "x" * 60,
                                       "sampling_params": {"max_new_tokens": 1000}})
    assert r.status_code == 200
    assert fake.calls[-1]["sampling_params"]["max_new_tokens"] == 4
    assert r.json()["meta_info"]["completion_tokens"] == 4
    client.post("/generate", json={"text": "x" * 10})  # default 128 > room 54: clamped too
    assert fake.calls[-1]["sampling_params"]["max_new_tokens"] == 54


def test_model_and_server_info(client: TestClient) -> None:
    info = client.get("/get_model_info").json()
    assert info["model_path"] == "/fake/model" and info["is_generation"] is True
    assert info["chat_template"] == FakeEngine().tokenizer.chat_template
    assert info["default_system_prompt"] == "You are fake."
    server = client.get("/get_server_info").json()
    assert server["context_length"] == 64 and server["max_running_requests"] == 8
    assert server["stats"]["kv_capacity"] == 4096
    assert server["server"]["host"] == "127.0.0.1"


def test_flush_cache_and_abort_request(client: TestClient, fake: FakeEngine) -> None:
    assert client.post("/flush_cache").status_code == 200
    fake.running["busy"] = 3
    assert client.post("/flush_cache").status_code == 400
    r = client.post("/abort_request", json={"rid": "zzz"})
    assert r.status_code == 200 and fake.aborted == ["zzz"]
    assert client.post("/abort_request", json={}).status_code == 400


def test_health_generate(client: TestClient, fake: FakeEngine) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200
    assert fake.calls[-1]["sampling_params"]["max_new_tokens"] == 1


def test_constraint_failing_in_the_engine_is_400(client: TestClient) -> None:
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"regex": "("}})
    assert r.status_code == 400 and "bad regex" in r.json()["error"]["message"]
    r = client.post("/generate", json={"text": "hi", "stream": True,
                                       "sampling_params": {"regex": "("}})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and "bad regex" in json.loads(events[-2])["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "hi", "regex": "("})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_constraint"


def test_aliases_tokenize_detokenize(client: TestClient) -> None:
    assert client.get("/model_info").json() == client.get("/get_model_info").json()
    assert client.get("/server_info").status_code == 200
    assert client.get("/get_server_args").status_code == 200
    r = client.post("/tokenize", json={"prompt": "hi"}).json()
    assert r == {"tokens": [104, 105], "count": 2, "max_model_len": 64}
    assert client.post("/tokenize", json={"prompt": ["a", "bc"]}).json()["count"] == [1, 2]
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"text": "hi"}
    assert client.post("/detokenize", json={"tokens": ["x"]}).status_code == 400
