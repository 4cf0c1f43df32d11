"""Operations and protection against the fake engine: API key, body cap, 429, disconnects,
timeouts, /health under load, /metrics, graceful shutdown of `launch.serve`."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeEngine, ThreadServer, free_port, wait_until
from server_fakes import fake_server_process as serve_fake_process

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings

LONG = {"max_new_tokens": 100_000}


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[FakeEngine, str]]:
    """A fake engine taking 10 ms per token, served on loopback."""
    fake = FakeEngine(context_len=10**6, step_delay=0.01)
    with ThreadServer(create_app(fake)) as server:
        yield fake, server.base_url


# ---------------------------------------------------------------- protection


def test_api_key_on_every_route_but_health() -> None:
    client = TestClient(create_app(FakeEngine(), ServerSettings(api_key="s3cret")))
    assert client.get("/health").status_code == 200
    for method, path in [("GET", "/metrics"), ("GET", "/get_model_info"),
                         ("POST", "/generate"), ("GET", "/v1/models"), ("POST", "/flush_cache")]:
        r = client.request(method, path, json={"text": "hi"})
        assert r.status_code == 401, path
        assert "API key" in r.json()["error"]["message"]
    ok = client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    bad = client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401


def test_api_key_with_openai_client() -> None:
    with ThreadServer(create_app(FakeEngine(), ServerSettings(api_key="k"))) as server:
        good = openai.OpenAI(base_url=server.base_url + "/v1", api_key="k", max_retries=0)
        assert good.completions.create(model="m", prompt="hi", max_tokens=1).choices
        bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="m", prompt="hi", max_tokens=1)


def test_body_cap_413_with_and_without_content_length() -> None:
    client = TestClient(create_app(FakeEngine(), ServerSettings(max_body_bytes=100)))
    r = client.post("/generate", json={"text": "x" * 200})
    assert r.status_code == 413 and "exceeds 100 bytes" in r.json()["error"]["message"]

    def chunked() -> Iterator[bytes]:
        yield b'{"text": "'
        yield b"x" * 200
        yield b'"}'

    r = client.post("/generate", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.post("/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 1}}).status_code == 200


def test_a_fan_out_the_queue_can_never_hold_is_400_not_429() -> None:
    """n=3 (or a batch of 3) against a queue bound of 2: a retry could never succeed, so it
    is a 400 naming the bound, not a 429; nothing is queued."""
    fake = FakeEngine()
    client = TestClient(create_app(fake, ServerSettings(max_queued_requests=2)))
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"n": 3}})
    assert r.status_code == 400 and "holds at most 2" in r.json()["error"]["message"]
    r = client.post("/generate", json={"text": ["a", "b", "c"]})
    assert r.status_code == 400 and "retry-after" not in r.headers
    r = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "n": 3})
    assert r.status_code == 400
    assert not fake.calls


def test_queue_full_is_429_with_retry_after() -> None:
    fake = FakeEngine()
    client = TestClient(create_app(fake, ServerSettings(max_queued_requests=2)))
    fake.forced_waiting = 2
    r = client.post("/generate", json={"text": "hi"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 429
    assert not fake.calls  # nothing was queued
    fake.forced_waiting = 1
    assert client.post("/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 1}}).status_code == 200
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"n": 2}})
    assert r.status_code == 429  # 1 waiting + 2 new > 2
    assert "radixlm_rejected_requests_total" in client.get("/metrics").text


def test_engine_queue_full_error_is_429() -> None:
    fake = FakeEngine(max_queued_requests=2)  # the engine raises QueueFullError itself
    fake.forced_waiting = 1
    client = TestClient(create_app(fake))
    r = client.post("/generate", json={"text": ["a", "b"]})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert "queue is full" in r.json()["error"]["message"]


# ---------------------------------------------------------------- disconnects and timeouts


def test_stream_disconnect_aborts_and_frees_kv(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    with httpx.Client(base_url=url) as c, c.stream(
            "POST", "/generate", json={"text": "hi", "rid": "gone", "stream": True,
                                       "sampling_params": LONG}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert "gone" in fake.running
    # the client closed the connection mid-stream
    wait_until(lambda: "gone" in fake.aborted, "the server to abort the request")
    wait_until(lambda: "gone" not in fake.running, "the request to leave the engine")
    assert fake.get_stats()["kv_used_tokens"] == sum(fake.running.values())


def test_non_stream_disconnect_aborts(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"text": "hi", "rid": "hangup", "sampling_params": LONG}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: "hangup" in fake.running, "the request to start")
    wait_until(lambda: "hangup" in fake.aborted, "the server to abort the request")
    wait_until(lambda: "hangup" not in fake.running, "the request to leave the engine")


def test_openai_stream_disconnect_aborts(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model="m", prompt="hi", max_tokens=100_000, stream=True,
                                       extra_body={"rid": "oai-gone"})
    next(iter(stream))
    stream.close()
    wait_until(lambda: "oai-gone" in fake.aborted, "the server to abort the request")


def test_request_timeout_aborts_with_504() -> None:
    fake = FakeEngine(context_len=10**6, step_delay=0.01)
    client = TestClient(create_app(fake, ServerSettings(request_timeout=0.3)))
    r = client.post("/generate", json={"text": "hi", "rid": "slowpoke", "sampling_params": LONG})
    assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
    assert "slowpoke" in fake.aborted
    r = client.post("/generate", json={"text": "hi", "rid": "slowstream", "stream": True,
                                       "sampling_params": LONG})
    events = [e for e in r.text.split("\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and "timed out" in events[-2]
    assert "slowstream" in fake.aborted


def test_abort_request_ends_a_running_stream(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    with httpx.Client(base_url=url) as c, c.stream(
            "POST", "/generate", json={"text": "hi", "rid": "victim", "stream": True,
                                       "sampling_params": LONG}) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        next(lines)
        assert c.post("/abort_request", json={"rid": "victim"}).status_code == 200
        rest = list(lines)
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["meta_info"]["finish_reason"]["type"] == "abort"


# ---------------------------------------------------------------- health and metrics


def test_health_answers_while_a_generation_is_in_flight(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    with httpx.Client(base_url=url) as c, c.stream(
            "POST", "/generate", json={"text": "hi", "rid": "busy", "stream": True,
                                       "sampling_params": {"max_new_tokens": 100}}) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        next(lines)
        assert c.get("/health").status_code == 200
        assert "busy" in fake.running  # health answered before the generation finished
        rest = list(lines)
    assert rest[-1] == "data: [DONE]"


def test_metrics_after_requests(slow: tuple[FakeEngine, str]) -> None:
    _, url = slow
    with httpx.Client(base_url=url) as c:
        c.post("/generate", json={"text": "hi", "stream": True,
                                  "sampling_params": {"max_new_tokens": 3}})
        c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
        text = c.get("/metrics").text
    for name in ("radixlm_requests_total", "radixlm_prompt_tokens_total",
                 "radixlm_generation_tokens_total", "radixlm_num_running_requests",
                 "radixlm_num_queued_requests", "radixlm_kv_usage_ratio",
                 "radixlm_cache_hit_rate", "radixlm_time_to_first_token_seconds_count",
                 "radixlm_inter_token_latency_seconds_count",
                 "radixlm_e2e_request_latency_seconds_count", "radixlm_forced_tokens_total",
                 "radixlm_http_requests_total"):
        assert name in text, name
    ttft = [ln for ln in text.splitlines()
            if ln.startswith("radixlm_time_to_first_token_seconds_count")]
    assert float(ttft[0].split()[-1]) >= 1
    assert 'radixlm_requests_total{finish_reason="length"}' in text
    assert 'radixlm_http_requests_total{method="POST",route="/generate",status="200"}' in text


def test_non_streamed_ttft_comes_from_the_engine_and_requests_are_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    client = TestClient(create_app(FakeEngine()))
    with caplog.at_level("INFO", logger="radixlm.server"):
        r = client.post("/generate", json={"text": "hi", "rid": "logged",
                                           "sampling_params": {"max_new_tokens": 2}})
    lines = [json.loads(rec.getMessage()) for rec in caplog.records
             if rec.name == "radixlm.server"]
    gen = next(x for x in lines if x["event"] == "generation")
    assert gen["rid"] == "logged" and gen["completion_tokens"] == 2
    http = next(x for x in lines if x["event"] == "http_request")
    assert http["request_id"] == r.headers["x-request-id"] and http["status"] == 200
    text = client.get("/metrics").text
    assert "radixlm_time_to_first_token_seconds_sum 0.005" in text


def test_bad_engine_option_exits_2() -> None:
    from radixlm.server.launch import serve

    def bad(**_: object) -> FakeEngine:
        raise ValueError("context_length must be >= 2")

    assert serve({}, ServerSettings(port=free_port()), "warning", engine_factory=bad) == 2


def test_two_apps_in_one_process_have_separate_metrics() -> None:
    a, b = TestClient(create_app(FakeEngine())), TestClient(create_app(FakeEngine()))
    a.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    line = 'radixlm_requests_total{finish_reason="length"}'
    assert line in a.get("/metrics").text and line not in b.get("/metrics").text


# ---------------------------------------------------------------- graceful shutdown

@pytest.fixture
def fake_server_process(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen,
                                                                          str]]:
    """The fake engine (10 ms a token) behind `launch.serve` in a child process, with
    shutdown_timeout = the parameter."""
    with serve_fake_process("FakeEngine(context_len=10**6, step_delay=0.01)",
                            settings=f", shutdown_timeout={request.param}") as served:
        yield served


@pytest.mark.parametrize("fake_server_process", [30], indirect=True)
def test_sigterm_finishes_in_flight_stream_and_exits_0(fake_server_process) -> None:
    proc, url = fake_server_process
    with httpx.Client(base_url=url, timeout=60) as c, c.stream(
            "POST", "/generate", json={"text": "hi", "stream": True,
                                       "sampling_params": {"max_new_tokens": 100}}) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        next(lines)
        proc.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert rest[-1] == "data: [DONE]"
    final = json.loads(rest[-2][6:])
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 100}
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("fake_server_process", [1], indirect=True)
def test_sigterm_aborts_past_the_deadline_and_exits_0(fake_server_process) -> None:
    proc, url = fake_server_process
    with httpx.Client(base_url=url, timeout=60) as c, c.stream(
            "POST", "/generate", json={"text": "hi", "stream": True,
                                       "sampling_params": LONG}) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        next(lines)
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(httpx.RemoteProtocolError):
            list(lines)  # cut off after the deadline: the request was aborted
    assert proc.wait(timeout=30) == 0
