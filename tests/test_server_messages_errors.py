"""The Anthropic Messages API's refusals: each bad request a 400 in Anthropic's error shape
whose message names the field, 401 for a wrong key (taken from `x-api-key` or Bearer), 429
for a full queue before any byte; none of them reaches the engine, and the engine keeps
serving after them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeEngine, ThreadServer

from radixlm.server.app import create_app
from radixlm.server.state import ServerSettings

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "input_schema": PARAMS}
HI = [{"role": "user", "content": "hi"}]
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}


def _result(tool_use_id: str = "toolu_1", **more: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": "21 C", **more}


@pytest.fixture(scope="module")
def fake() -> FakeEngine:
    return FakeEngine(context_len=4096)


@pytest.fixture(scope="module")
def http(fake: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(fake)) as client:
        yield client


def _anthropic_error(response: Any, status: int, kind: str) -> str:
    """The message of an error response, checked to be Anthropic's shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    return body["error"]["message"]


@pytest.mark.parametrize("change, needle", [
    ({"max_tokens": None}, "max_tokens: Field required"),
    ({"max_tokens": -1}, "max_tokens: Input should be greater than or equal to 0"),
    ({"model": None}, "model: Field required"),
    ({"messages": []}, "messages: at least one message is required"),
    ({"messages": None}, "messages: Field required"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0.role: 'bot'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role: 'tool'"),
    ({"messages": [{"role": "user"}]}, "messages.0.content: Field required"),
    ({"messages": [{"role": "user", "content": ""}]}, "messages.0.content: must not be empty"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]},
     "messages.0.name: Extra inputs are not permitted"),
    ({"messages": [{"role": "user", "content": [_result()]}]},
     "messages.0.content.0.tool_use_id: 'toolu_1' answers no tool_use block"),
    ({"messages": [*HI, {"role": "assistant", "content": [CALL]},
                   {"role": "user", "content": [_result("toolu_2")]}]},
     "messages.2.content.0.tool_use_id: 'toolu_2'"),
    ({"messages": [*HI, {"role": "assistant", "content": [CALL]}]},
     "messages.1.content: a final assistant message is a prefill"),
    ({"messages": [*HI, {"role": "assistant", "content": [CALL]},
                   {"role": "user", "content": [_result(is_error="yes")]}]},
     "messages.2.content.0.is_error: must be a boolean"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     "messages.0.content.0.type: 'image' blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages.0.content.0.type: 'document' blocks"),
    ({"messages": [{"role": "user", "content": [{"type": "frobnicate"}]}]},
     "messages.0.content.0.type: 'frobnicate' blocks"),
    ({"messages": [{"role": "user", "content": [CALL]}]},
     "messages.0.content.0.type: 'tool_use' blocks are not supported by this server"),
    ({"messages": [*HI, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "a"}]}]},
     "messages.1.content.0.type: 'redacted_thinking'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                                                 "citations": [{"type": "char_location"}]}]}]},
     "messages.0.content.0.citations: not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text: required"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                                                 "cache_control": {"type": "forever"}}]}]},
     "messages.0.content.0.cache_control: must be {'type': 'ephemeral'}"),
    ({"system": [{"type": "image", "source": {}}]}, "system.0.type: 'image' blocks"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools.0.type: 'web_search_20250305' tools are not supported"),
    ({"tools": [{"name": "get_weather"}]}, "tools.0.input_schema: required"),
    ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools.0.name must match"),
    ({"tools": [WEATHER, WEATHER]}, "tools.1.name 'get_weather' is given twice"),
    ({"tools": [{**WEATHER, "input_schema": {"type": "object", "minProperties": "x"}}]},
     "tools.0.input_schema (function 'get_weather')"),
    ({"tools": [{**WEATHER, "input_examples": [{"city": "Oslo"}]}]},
     "tools.0.input_examples: not supported"),
    ({"tools": [{**WEATHER, "colour": "red"}]}, "tools.0.colour: Extra inputs"),
    ({"tools": [{**WEATHER, "strict": "yes"}]}, "tools.0.strict: must be a boolean"),
    ({"tools": [{**WEATHER, "eager_input_streaming": False}]},
     "tools.0.eager_input_streaming: false is not supported"),
    ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools.0.defer_loading: not supported"),
    ({"system": 3}, "system: Input should be a valid string"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "'tool_choice' names function 'nope', which is not in 'tools'"),
    ({"tool_choice": {"type": "any"}}, "'tool_choice' needs 'tools'"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice: name is required with type 'tool'"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type: Input should be"),
    ({"tools": [WEATHER], "tool_choice": {"type": "any"},
      "output_config": {"format": {"type": "json_schema", "schema": PARAMS}}},
     "(tool_choice 'any') cannot be combined with output_config.format"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}},
     "thinking: type 'enabled' needs a model with a reasoning parser"),
    ({"thinking": {"type": "adaptive"}}, "thinking: type 'adaptive' needs a model"),
    ({"thinking": {"type": "enabled"}}, "thinking: budget_tokens is required"),
    ({"thinking": {"type": "enabled", "budget_tokens": 64}},
     "thinking.budget_tokens: must be less than max_tokens (64 >= 64)"),
    ({"thinking": {"type": "between_tools"}}, "thinking.type: Input should be"),
    ({"temperature": 1.5}, "temperature: Input should be less than or equal to 1"),
    ({"top_p": 0}, "top_p: Input should be greater than 0"),
    ({"top_k": 0}, "top_k: Input should be greater than or equal to 1"),
    ({"stop_sequences": ["s"] * 17}, "stop_sequences"),
    ({"stop_sequences": "\n"}, "stop_sequences: Input should be a valid list"),
    ({"metadata": {"user_id": "u", "tier": "gold"}}, "metadata.tier: Extra inputs"),
    ({"service_tier": "priority"}, "service_tier: Input should be"),
    ({"speed": "fast"}, "speed: Input should be 'standard'"),
    ({"container": "c_1"}, "container: not supported by this server"),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
     "mcp_servers: not supported"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
     "context_management: not supported"),
    ({"inference_geo": "eu"}, "inference_geo: not supported"),
    ({"output_config": {"effort": "high"}}, "output_config.effort: not supported"),
    ({"output_config": {"format": {"type": "json_schema"}}},
     "output_config.format.schema: Field required"),
    ({"frobnicate": 1}, "frobnicate: Extra inputs are not permitted"),
    ({"messages": [{"role": "user", "content": "x" * 600_000}]}, "fits the context"),
])
def test_bad_requests_are_400_in_anthropic_shape(http: TestClient, fake: FakeEngine,
                                                 change: dict, needle: str) -> None:
    body = {"model": "m", "max_tokens": 64, "messages": HI, **change}
    body = {k: v for k, v in body.items() if v is not None}
    before = len(fake.calls)
    message = _anthropic_error(http.post("/v1/messages", json=body), 400,
                               "invalid_request_error")
    assert needle in message, message
    assert len(fake.calls) == before  # refused before the engine
    ok = http.post("/v1/messages", json={"model": "m", "max_tokens": 2, "messages": HI})
    assert ok.status_code == 200 and ok.json()["content"][0]["text"] == "ab"


def test_a_lone_surrogate_is_400(http: TestClient) -> None:
    body = (b'{"model": "m", "max_tokens": 64, "messages": [{"role": "user", '
            b'"content": "\\ud800"}]}')
    message = _anthropic_error(http.post("/v1/messages", content=body), 400,
                               "invalid_request_error")
    assert "not valid Unicode" in message


def test_count_tokens_refusals(http: TestClient) -> None:
    ok = http.post("/v1/messages/count_tokens", json={"model": "m", "messages": HI})
    assert ok.status_code == 200 and set(ok.json()) == {"input_tokens"}
    for change, needle in [({"max_tokens": 5}, "max_tokens: Extra inputs"),
                           ({"messages": []}, "messages: at least one"),
                           ({"tools": [{"type": "bash_20250124", "name": "bash"}]},
                            "tools.0.type: 'bash_20250124'")]:
        body = {"model": "m", "messages": HI, **change}
        message = _anthropic_error(http.post("/v1/messages/count_tokens", json=body), 400,
                                   "invalid_request_error")
        assert needle in message, message


def test_invalid_json_and_the_official_client_error(http: TestClient, fake: FakeEngine) -> None:
    bad = http.post("/v1/messages", content=b"{nope", headers={"content-type":
                                                                  "application/json"})
    assert "not valid JSON" in _anthropic_error(bad, 400, "invalid_request_error")
    with ThreadServer(create_app(fake)) as server:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="m", max_tokens=10, messages=[
                {"role": "user", "content": [_result()]}])
        assert info.value.body["error"]["type"] == "invalid_request_error"
        assert "tool_use_id" in info.value.body["error"]["message"]


def test_api_key_from_x_api_key_or_bearer_and_401_in_anthropic_shape() -> None:
    with ThreadServer(create_app(FakeEngine(), ServerSettings(api_key="k"))) as server:
        good = anthropic.Anthropic(base_url=server.base_url, api_key="k", max_retries=0)
        assert good.messages.create(model="m", max_tokens=1, messages=HI).content[0].text == "a"
        by_header = anthropic.Anthropic(base_url=server.base_url, auth_token=None,
                                        api_key="unused", max_retries=0,
                                        default_headers={"Authorization": anthropic.Omit(),
                                                         "X-Api-Key": "k"})
        assert by_header.messages.count_tokens(model="m", messages=HI).input_tokens > 0
        for bad in (anthropic.Anthropic(base_url=server.base_url, api_key="nope",
                                        max_retries=0),
                    anthropic.Anthropic(base_url=server.base_url, api_key="unused",
                                        max_retries=0, default_headers={
                                            "Authorization": anthropic.Omit(),
                                            "X-Api-Key": "nope"})):
            with pytest.raises(anthropic.AuthenticationError) as info:
                bad.messages.create(model="m", max_tokens=1, messages=HI)
            assert info.value.body["type"] == "error"
            assert info.value.body["error"]["type"] == "authentication_error"
        with TestClient(create_app(FakeEngine(), ServerSettings(api_key="k"))) as http:
            other = http.post("/v1/chat/completions", headers={"x-api-key": "k"},
                              json={"model": "m", "max_tokens": 1, "messages": HI})
            assert other.status_code == 200  # the header serves every route
            refused = http.post("/v1/chat/completions", json={"model": "m", "messages": HI})
            assert refused.status_code == 401 and "error" in refused.json()  # OpenAI's shape


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_is_a_429_before_any_byte(stream: bool) -> None:
    fake = FakeEngine(max_queued_requests=1)
    fake.forced_waiting = 1
    with TestClient(create_app(fake)) as http, http.stream(
            "POST", "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": HI,
                                          "stream": stream}) as r:
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        body = json.loads(r.read())
    assert body["error"]["type"] == "rate_limit_error" and not fake.calls


def test_a_request_over_the_body_cap_is_413_in_anthropic_shape() -> None:
    app = create_app(FakeEngine(), ServerSettings(max_body_bytes=1000))
    with TestClient(app) as http:
        r = http.post("/v1/messages", json={"model": "m", "max_tokens": 5,
                                            "messages": [{"role": "user", "content": "x" * 2000}]})
    _anthropic_error(r, 413, "request_too_large")

