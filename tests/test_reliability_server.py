"""The HTTP layer's reliability against the fake engine (fast): nothing on the event loop,
atomic admission with 429 + Retry-After before any stream byte, honest 400/500 errors,
one validation for every route (stated in /openapi.json), a dead engine, and a client that
stops reading. Each test here fails on the server as it was before issue 13."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_fakes import (
    FakeEngine,
    FakeTokenizer,
    ThreadServer,
    fake_server_process,
    wait_until,
)

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings

ONE = {"max_new_tokens": 1}


def _raw(client: TestClient, path: str, body: str) -> httpx.Response:
    return client.post(path, content=body.encode(), headers={"content-type": "application/json"})


# ---------------------------------------------------------------- D1: off the event loop


class SlowTokenizer(FakeTokenizer):
    """Takes 1.5 s to tokenize anything: stands in for a multi-MB prompt."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        time.sleep(1.5)
        return super().encode(text, add_special_tokens)


def test_health_answers_while_a_prompt_is_tokenized() -> None:
    fake = FakeEngine(context_len=10**6)
    fake.tokenizer = SlowTokenizer()
    with ThreadServer(create_app(fake)) as server:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            import threading

            t = threading.Thread(target=c.post, args=("/generate",),
                                 kwargs={"json": {"text": "hello", "sampling_params": ONE}})
            t.start()
            time.sleep(0.3)  # the tokenizer is busy now
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            waited = time.perf_counter() - t0
            t.join(30)
        assert waited < 0.5, f"/health waited {waited:.2f} s behind the tokenizer"
        assert fake.calls and fake.calls[-1]["text"] == "hello"


def test_prompt_too_long_in_bytes_is_refused_before_tokenizing() -> None:
    fake = FakeEngine(context_len=100)
    fake.tokenizer = SlowTokenizer()
    client = TestClient(create_app(fake))
    t0 = time.perf_counter()
    r = client.post("/v1/completions", json={"model": "m", "prompt": "a " * 2_600_000})
    assert r.status_code == 400 and "bytes" in r.json()["error"]["message"]
    assert time.perf_counter() - t0 < 1.4  # the 1.5 s tokenizer never ran
    r = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "a" * 10_000}]})
    assert r.status_code == 400 and "bytes" in r.json()["error"]["message"]


# ---------------------------------------------------------------- D2: admission


def test_fan_out_takes_n_places_or_is_refused_whole() -> None:
    fake = FakeEngine(max_queued_requests=4)
    client = TestClient(create_app(fake))
    fake.forced_waiting = 2  # two places left
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"n": 3}})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert not fake.calls  # not one of the 3 samples was queued
    r = client.post("/v1/completions", json={"model": "m", "prompt": ["a", "b", "c"], "n": 1})
    assert r.status_code == 429 and not fake.calls
    fake.forced_waiting = 0
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"n": 4, **ONE}})
    assert r.status_code == 200 and len(r.json()) == 4
    assert fake.reserved == 0  # every place was given back
    metrics = client.get("/metrics").text
    assert 'radixlm_rejected_requests_total{reason="queue_full"} 2.0' in metrics


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "hi", "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stream": True}),
    ("/v1/chat/completions", {"model": "m", "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]}),
])
def test_a_stream_that_cannot_be_admitted_is_a_429_before_any_byte(path: str, body: dict) -> None:
    fake = FakeEngine(max_queued_requests=1)
    fake.forced_waiting = 1
    client = TestClient(create_app(fake))
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert json.loads(r.read())["error"]["code"] == "queue_full"
    assert not fake.calls


# ---------------------------------------------------------------- D3: engine errors


@pytest.mark.parametrize("body, needle", [
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": 1_000_000}, "top_logprobs_num"),
    ({"text": "hi", "sampling_params": {"repetition_penalty": 5e-324}}, "repetition_penalty"),
    ({"text": "hi", "sampling_params": {"presence_penalty": 3}}, "presence_penalty"),
])
def test_input_the_engine_cannot_serve_is_a_400_before_admission(body: dict, needle: str) -> None:
    fake = FakeEngine()
    client = TestClient(create_app(fake))
    r = client.post("/generate", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert not fake.calls


def test_internal_failure_is_a_500_in_the_openai_shape_and_counted() -> None:
    client = TestClient(create_app(FakeEngine()))
    crash = {"regex": "!crash"}
    r = client.post("/generate", json={"text": "hi", "sampling_params": crash})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "internal_error"
    r = client.post("/v1/completions", json={"model": "m", "prompt": "hi", **crash})
    assert r.status_code == 500 and "injected" in r.json()["error"]["message"]
    with client.stream("POST", "/v1/completions", json={
            "model": "m", "prompt": "hi", "stream": True, **crash}) as s:
        assert s.status_code == 200  # the status line went out when the stream opened
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "internal_error"
    metrics = client.get("/metrics").text
    assert 'radixlm_failed_requests_total{reason="internal_error"} 3.0' in metrics


# ---------------------------------------------------------------- D4: lone surrogates


@pytest.mark.parametrize("path, body", [
    ("/generate", '{"text": "\\ud800x"}'),
    ("/generate", '{"text": "hi", "sampling_params": {"stop": "\\udfff"}}'),
    ("/v1/completions", '{"model": "m", "prompt": "\\udc80"}'),
    ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", '
                             '"content": "a\\ud83d"}]}'),
    ("/tokenize", '{"prompt": "\\ud800"}'),
])
def test_lone_surrogates_are_a_400_never_a_500(path: str, body: str) -> None:
    fake = FakeEngine()
    client = TestClient(create_app(fake), raise_server_exceptions=False)
    r = _raw(client, path, body)
    assert r.status_code == 400, r.text
    assert "unicode" in r.json()["error"]["message"].lower()
    assert not fake.calls


# ---------------------------------------------------------------- D5: one validation


@pytest.mark.parametrize("body", [
    '{"text": "hi", "sampling_params": {"temperature": 1e308}}',
    '{"text": "hi", "sampling_params": {"temperature": Infinity}}',
    '{"text": "hi", "sampling_params": {"temperature": NaN}}',
    '{"text": "hi", "sampling_params": {"n": 10000}}',
    json.dumps({"text": "hi", "sampling_params": {"stop": ["x"] * 10_000}}),
    json.dumps({"text": "hi", "sampling_params": {"stop": "x" * 10_000}}),
])
def test_generate_refuses_what_the_openai_routes_refuse(body: str) -> None:
    fake = FakeEngine()
    client = TestClient(create_app(fake))
    r = _raw(client, "/generate", body)
    assert r.status_code == 400, r.text
    assert "sampling_params." in r.json()["error"]["message"]
    head = '{"text": "hi", "sampling_params": {'
    assert body.startswith(head) and body.endswith("}}")
    r = _raw(client, "/v1/completions", '{"model": "m", "prompt": "hi", ' + body[len(head):-1])
    assert r.status_code == 400, r.text
    assert not fake.calls


def test_openapi_states_the_bounds() -> None:
    import warnings

    from radixlm.runtime.sampling_params import (
        MAX_N,
        MAX_STOP,
        MAX_TOP_LOGPROBS,
        OPENAI_TEMPERATURE_RANGE,
        TEMPERATURE_RANGE,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns on a duplicate operation id
        schema = TestClient(create_app(FakeEngine())).get("/openapi.json").json()
    op_ids = [op["operationId"] for path in schema["paths"].values() for op in path.values()]
    assert len(op_ids) == len(set(op_ids))
    assert {"flush_cache", "flush_cache_get"} <= set(op_ids)
    comps = schema["components"]["schemas"]
    sp = comps["SamplingParamsBody"]["properties"]

    def bound(prop: dict[str, Any], key: str) -> Any:
        return next(o[key] for o in prop.get("anyOf", [prop]) if key in o)

    assert bound(sp["temperature"], "maximum") == TEMPERATURE_RANGE[1]
    assert bound(sp["n"], "maximum") == MAX_N
    stop_list = next(o for o in sp["stop"]["anyOf"] if o.get("type") == "array")
    assert stop_list["maxItems"] == MAX_STOP
    gen = comps["GenerateRequest"]["properties"]
    assert bound(gen["top_logprobs_num"], "maximum") == MAX_TOP_LOGPROBS
    cmpl = comps["CompletionRequest"]["properties"]
    assert bound(cmpl["temperature"], "maximum") == OPENAI_TEMPERATURE_RANGE[1]
    assert bound(cmpl["n"], "maximum") == MAX_N


# ---------------------------------------------------------------- faults


def test_dead_engine_health_503_and_requests_503() -> None:
    fake = FakeEngine()
    client = TestClient(create_app(fake))
    assert client.get("/health").status_code == 200
    fake.alive = False
    assert client.get("/health").status_code == 503
    r = client.post("/generate", json={"text": "hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"


_DYING = """
class Dying(FakeEngine):
    born = time.monotonic()
    def is_alive(self):
        return time.monotonic() - self.born < 3.0
"""


def test_server_exits_non_zero_when_the_engine_dies() -> None:
    with fake_server_process("Dying()", log_level="critical", preamble=_DYING) as (proc, _):
        # it answered /health in its engine's first 3 s
        assert proc.wait(timeout=60) == 1
        assert "the engine thread has died" in (proc.stderr.read() if proc.stderr else "")


def test_a_client_that_stops_reading_is_dropped_and_its_request_aborted() -> None:
    fake = FakeEngine(context_len=10**7, step_delay=0.0)
    with ThreadServer(create_app(fake, ServerSettings(stream_stall_timeout=0.5))) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            body = json.dumps({"text": "hi", "stream": True, "rid": "stalled",
                               "sampling_params": {"max_new_tokens": 5_000_000}}).encode()
            sock.sendall(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: "
                         b"application/json\r\ncontent-length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
            # never read: the server's writes block, then it gives up and aborts
            wait_until(lambda: "stalled" in fake.aborted, "the stalled stream's abort",
                       limit_s=30)
        wait_until(lambda: "stalled" not in fake.running, "the engine to let go", limit_s=10)
