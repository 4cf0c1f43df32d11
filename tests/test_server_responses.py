"""The OpenAI Responses API through the official `openai` client: against a scripted fake
engine (input items, every 400, the store, stream events, usage, protection), and a few
calls on the shared real server (text, strict JSON schema checked with jsonschema, a tool
call and its output, `previous_response_id`, the stream equal to the one-shot answer).
The reference for the input mapping is the Chat Completions route: the same conversation
sent there must reach the engine as the same tokens with the same sampling params."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from server_fakes import (
    FakeEngine,
    ScriptedConfig,
    ScriptedEngine,
    ThreadServer,
    wait_until,
)

from radixlm.server.app import create_app
from radixlm.server.responses_store import ResponseStore
from radixlm.server.state import ServerSettings

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": PARAMS}
CHAT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS,
    "strict": True}}
CALL_TEXT = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' \
            '</tool_call>'


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedEngine, ThreadServer]]:
    fake = ScriptedEngine(context_len=4096)
    with ThreadServer(create_app(fake)) as server:
        yield fake, server


@pytest.fixture
def fake(served: tuple[ScriptedEngine, ThreadServer]) -> Iterator[ScriptedEngine]:
    engine = served[0]
    yield engine
    engine.reset()


@pytest.fixture
def client(served: tuple[ScriptedEngine, ThreadServer]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].base_url + "/v1", api_key="alice", max_retries=0)


def _other(served: tuple[ScriptedEngine, ThreadServer], key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].base_url + "/v1", api_key=key, max_retries=0)


# ---------------------------------------------------------------- requests and output


def test_text_response_fields_and_usage(client: openai.OpenAI, fake: ScriptedEngine) -> None:
    fake.script = "Hello there."
    r = client.responses.create(model="m", input="hi", instructions="Be nice.",
                                max_output_tokens=50, temperature=0.5, top_p=0.9,
                                metadata={"k": "v"}, user="u1")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Hello there." and r.incomplete_details is None
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert msg.content[0].type == "output_text" and msg.id.startswith("msg_")
    sent = fake.calls[-1]
    expected = fake.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True)["input_ids"]
    assert sent["input_ids"] == expected
    assert sent["sampling_params"]["temperature"] == 0.5
    assert sent["sampling_params"]["top_p"] == 0.9
    assert sent["sampling_params"]["max_new_tokens"] == 50
    assert (r.temperature, r.top_p, r.max_output_tokens) == (0.5, 0.9, 50)
    assert r.metadata == {"k": "v"} and r.user == "u1" and r.instructions == "Be nice."
    u = r.usage
    assert u.input_tokens == len(expected) and u.output_tokens == len("Hello there.")
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 2
    assert u.output_tokens_details.reasoning_tokens == 0


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="hi", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "abc" and r.output[0].status == "incomplete"


def test_input_items_reach_the_engine_as_the_chat_route_sends_them(
        client: openai.OpenAI, fake: ScriptedEngine) -> None:
    fake.script = "ok"
    items = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "weather "},
                                     {"type": "input_text", "text": "in Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "look it up"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather",
         "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "18 C"}]},
        {"role": "user", "content": "thanks"},
    ]
    client.responses.create(model="m", input=items, instructions="You are terse.",
                            tools=[WEATHER], max_output_tokens=5)
    via_responses = fake.calls[-1]
    calls = [{"id": f"c{i}", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": c})}}
        for i, c in ((1, "Oslo"), (2, "Bergen"))]
    client.chat.completions.create(model="m", tools=[CHAT_WEATHER], max_completion_tokens=5,
                                   messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "look it up",
         "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "18 C"},
        {"role": "user", "content": "thanks"}])
    via_chat = fake.calls[-1]
    assert via_responses["input_ids"] == via_chat["input_ids"]
    assert via_responses["sampling_params"] == via_chat["sampling_params"]
    text = via_responses["text"]
    assert "Checking." in text and '"Bergen"' in text and "<tool_response>\n18 C" in text


@pytest.mark.parametrize("kwargs, needle, param", [
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
     "answers no earlier function_call", "input[0].call_id"),
    ({"tools": [{"type": "web_search"}]}, "'web_search'", "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "'file_search'",
     "tools[0].type"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
     "'code_interpreter'", "tools[0].type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "'nope'",
     "tools"),
    ({"tool_choice": "required"}, "needs 'tools'", "tools"),
    ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools[0].name must match", "tools"),
    ({"background": True}, "background", "background"),
    ({"include": ["file_search_call.results"]}, "file_search_call.results", "include"),
    ({"truncation": "auto"}, "only 'disabled'", "truncation"),
    ({"input": [{"role": "user", "content": [{"type": "input_image",
                                              "image_url": "http://x/y.png"}]}]},
     "'input_image' is not supported", "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'", "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "no"}]},
     "JSON string of an object", "input[0].arguments"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "'wizard'", "input[0].role"),
    ({"extra_body": {"frobnicate": 1}}, "Unrecognized request argument supplied: frobnicate",
     "frobnicate"),
    ({"reasoning": {"effort": "high"}}, "no reasoning parser", "reasoning"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "'schema'", "text.format"),
    ({"temperature": 5}, "temperature", "temperature"),
    ({"max_output_tokens": -1}, "max_output_tokens", "max_output_tokens"),
    ({"input": "x" * 5000}, "context length", "input"),
])
def test_bad_requests_are_400_in_openai_shape(client: openai.OpenAI, kwargs: dict, needle: str,
                                              param: str) -> None:
    args = {"model": "m", "input": "hi", "max_output_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**args)
    err = info.value.body
    assert needle in err["message"], err
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_function_call_output_and_previous_response(client: openai.OpenAI,
                                                    fake: ScriptedEngine) -> None:
    fake.script = CALL_TEXT
    first = client.responses.create(model="m", input="Weather in Oslo?", tools=[WEATHER])
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "Sure."
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Oslo"} and first.status == "completed"
    assert first.tools[0].strict is True and first.tools[0].name == "get_weather"
    fake.script = "It is 21 C."
    second = client.responses.create(
        model="m", previous_response_id=first.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}])
    assert second.output_text == "It is 21 C." and second.previous_response_id == first.id
    text = fake.calls[-1]["text"]
    assert "<user>Weather in Oslo?" in text and '"city": "Oslo"' in text
    assert text.endswith("<tool_response>\n21 C\n</tool_response>\n<assistant>")
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in items] == ["message", "message", "function_call",
                                       "function_call_output"]
    assert items[2].call_id == call.call_id


def test_reasoning_items_and_tokens(client: openai.OpenAI, fake: ScriptedEngine) -> None:
    fake.config = ScriptedConfig(context_length=4096, reasoning_parser="deepseek-r1")
    fake.script = "let me think</think>The answer."
    r = client.responses.create(model="m", input="q", reasoning={"effort": "low"})
    thought, msg = r.output
    assert thought.type == "reasoning" and thought.id.startswith("rs_")
    assert thought.content[0].type == "reasoning_text"
    assert thought.content[0].text == "let me think" and msg.content[0].text == "The answer."
    assert r.output_text == "The answer." and r.reasoning.effort == "low"
    # thinking tokens: those before the one that ends the block ("...</think" then ">")
    assert r.usage.output_tokens_details.reasoning_tokens == len("let me think</think")
    with client.responses.stream(model="m", input="q") as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.reasoning_text.delta")
        final = stream.get_final_response()
    assert deltas == "let me think" and final.output_text == "The answer."
    assert final.usage == r.usage


# ---------------------------------------------------------------- streaming


def _raw_events(url: str, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event of a POST; the stream has no [DONE] line."""
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert "[DONE]" not in text
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_stream_event_order_and_sequence_numbers(served, fake: ScriptedEngine) -> None:
    events = _raw_events(served[1].base_url, {"model": "m", "input": "hi", "stream": True,
                                              "max_output_tokens": 3})
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert [n for n, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 3,
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete"]
    created, last = events[0][1]["response"], events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert last["id"] == created["id"] and last["status"] == "incomplete"
    assert last["output"][0]["content"][0]["text"] == "abc"
    item_id = events[2][1]["item"]["id"]
    assert {d["item_id"] for _, d in events[3:9]} == {item_id}
    assert events[7][1]["text"] == "abc" and last["output"][0]["id"] == item_id


def test_stream_equals_the_one_shot_answer(client: openai.OpenAI, fake: ScriptedEngine) -> None:
    fake.script = CALL_TEXT
    one = client.responses.create(model="m", input="Weather?", tools=[WEATHER])
    with client.responses.stream(model="m", input="Weather?", tools=[WEATHER]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert final.output_text == one.output_text == "Sure." and final.usage == one.usage
    assert [o.type for o in final.output] == [o.type for o in one.output]
    assert (final.output[1].name, final.output[1].arguments) == (one.output[1].name,
                                                                 one.output[1].arguments)
    call_events = kinds[kinds.index("response.output_item.done") + 1:]
    assert call_events[0] == "response.output_item.added"
    assert set(call_events[1:-3]) == {"response.function_call_arguments.delta"}
    assert call_events[-3:] == ["response.function_call_arguments.done",
                                "response.output_item.done", "response.completed"]
    assert client.responses.retrieve(final.id).output[1].call_id == final.output[1].call_id


# ---------------------------------------------------------------- the store


def test_store_is_per_api_key_and_delete_forgets(served, client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="hi", max_output_tokens=2)
    assert client.responses.retrieve(r.id).output_text == r.output_text
    mallory = _other(served, "mallory")
    with pytest.raises(openai.NotFoundError):
        mallory.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as info:
        mallory.responses.create(model="m", input="more", previous_response_id=r.id)
    assert info.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        mallory.responses.delete(r.id)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="m", input="hi", max_output_tokens=1, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_store_evicts_least_recently_used_by_count(served, client: openai.OpenAI,
                                                   monkeypatch) -> None:
    monkeypatch.setattr(served[1].server.config.app.state, "responses",
                        ResponseStore(max_items=2))
    a, b, c = (client.responses.create(model="m", input=x, max_output_tokens=1).id
               for x in "abc")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(a)
    client.responses.retrieve(b)  # now the most recently used
    client.responses.create(model="m", input="d", max_output_tokens=1)
    client.responses.retrieve(b)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(c)


def test_store_evicts_by_bytes() -> None:
    store = ResponseStore(max_items=100, max_bytes=300)

    def response(i: int, pad: int) -> dict:
        return {"id": f"resp_{i}", "output": "x" * pad}

    assert store.put("o", response(1, 100), [])
    assert store.put("o", response(2, 100), [])
    assert store.bytes <= 300 and len(store) == 2
    assert store.put("o", response(3, 100), [])  # 3 x ~130 bytes > 300: the first goes
    assert store.get("resp_1", "o") is None and store.get("resp_2", "o") is not None
    assert not store.put("o", response(4, 400), [])  # larger than the whole budget
    assert store.get("resp_4", "o") is None and len(store) == 2
    assert store.get("resp_2", "someone else") is None
    assert store.delete("resp_2", "o") and not store.delete("resp_2", "o")
    assert store.bytes == store.get("resp_3", "o").size


def test_input_items_pages(client: openai.OpenAI) -> None:
    first = client.responses.create(model="m", input="one", max_output_tokens=1)
    second = client.responses.create(model="m", input="two", max_output_tokens=1,
                                     previous_response_id=first.id)
    newest = client.responses.input_items.list(second.id, limit=2)
    assert [i.content[0].text for i in newest.data] == ["two", "a"]
    assert newest.has_more and newest.first_id == newest.data[0].id
    rest = client.responses.input_items.list(second.id, after=newest.last_id)
    assert [i.content[0].text for i in rest.data] == ["one"] and not rest.has_more


# ---------------------------------------------------------------- protection


def test_api_key_is_enforced() -> None:
    with ThreadServer(create_app(FakeEngine(), ServerSettings(api_key="k"))) as server:
        good = openai.OpenAI(base_url=server.base_url + "/v1", api_key="k", max_retries=0)
        r = good.responses.create(model="m", input="hi", max_output_tokens=1)
        bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.responses.create(model="m", input="hi", max_output_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            bad.responses.retrieve(r.id)


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_is_a_429_before_any_byte(stream: bool) -> None:
    fake = FakeEngine(max_queued_requests=1)
    fake.forced_waiting = 1
    client = TestClient(create_app(fake))
    with client.stream("POST", "/v1/responses", json={"model": "m", "input": "hi",
                                                      "stream": stream}) as r:
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert json.loads(r.read())["error"]["code"] == "queue_full"
    assert not fake.calls


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[FakeEngine, str]]:
    fake = FakeEngine(context_len=10**6, step_delay=0.01)
    with ThreadServer(create_app(fake)) as server:
        yield fake, server.base_url


def test_stream_disconnect_aborts(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    stream = client.responses.create(model="m", input="hi", max_output_tokens=100_000,
                                     stream=True)
    created = next(iter(stream))
    rid = created.response.id.removeprefix("resp_")
    wait_until(lambda: rid in fake.running, "the request to start")
    stream.close()
    wait_until(lambda: rid in fake.aborted, "the server to abort the request")
    wait_until(lambda: rid not in fake.running, "the request to leave the engine")


def test_non_stream_disconnect_aborts(slow: tuple[FakeEngine, str]) -> None:
    fake, url = slow
    port = int(url.rsplit(":", 1)[1])
    before = set(fake.running)
    body = json.dumps({"model": "m", "input": "hi", "max_output_tokens": 100_000}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: set(fake.running) - before, "the request to start")
        [rid] = set(fake.running) - before
    wait_until(lambda: rid in fake.aborted, "the server to abort the request")
    wait_until(lambda: rid not in fake.running, "the request to leave the engine")


# ---------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def real(real_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.url + "/v1", api_key="x", max_retries=0,
                         timeout=120)


def _final(stream: Any) -> Any:
    """The response of a stream's last event (completed or incomplete)."""
    last = None
    for event in stream:
        last = event
    assert last.type in ("response.completed", "response.incomplete"), last.type
    return last.response


def test_real_text_and_stream_agree(real: openai.OpenAI) -> None:
    args = {"model": "m", "input": "Name a colour.", "temperature": 0,
            "max_output_tokens": 12}
    one = real.responses.create(**args)
    assert one.output_text.strip() and one.usage.output_tokens > 0
    with real.responses.stream(**args) as stream:
        final = _final(stream)
    assert final.output_text == one.output_text and final.status == one.status
    assert final.usage.input_tokens == one.usage.input_tokens
    assert final.usage.output_tokens == one.usage.output_tokens


def test_real_strict_json_schema(real: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
        "required": ["city", "population"]}
    r = real.responses.create(model="m", input="Describe Paris as JSON.", temperature=0,
                              max_output_tokens=60, text={"format": {
                                  "type": "json_schema", "name": "city", "schema": schema,
                                  "strict": True}})
    assert r.status == "completed", r.output_text
    value = json.loads(r.output_text)
    jsonschema.validate(value, {**schema, "additionalProperties": False})


def test_real_tool_call_then_its_output(real: openai.OpenAI) -> None:
    first = real.responses.create(model="m", input="What is the weather in Paris?",
                                  tools=[WEATHER], tool_choice="required", temperature=0,
                                  max_output_tokens=60, parallel_tool_calls=False)
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), {**PARAMS, "additionalProperties": False})
    second = real.responses.create(
        model="m", previous_response_id=first.id, tools=[WEATHER], tool_choice="none",
        temperature=0, max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"temp_c": 21})}])
    assert [o.type for o in second.output] == ["message"] and second.output_text
    alone = real.responses.create(model="m", input="What is the weather in Paris?",
                                  tools=[WEATHER], tool_choice="none", max_output_tokens=1)
    # the call and its output went into the prompt after the question
    assert second.usage.input_tokens > alone.usage.input_tokens + 20
