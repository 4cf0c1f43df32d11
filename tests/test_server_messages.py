"""The Anthropic Messages API through the official `anthropic` client, against a scripted
fake engine: the conversation and every sampling field reach the engine as the Chat
Completions route sends the same conversation (same tokens, same params, tool grammars
included), the answer's blocks and stop reasons, the stream's events and its final message,
count_tokens, every 400 and 401 in Anthropic's shape. The real model's calls are in
test_server_messages_real.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from server_fakes import (
    FakeEngine,
    ScriptedConfig,
    ScriptedEngine,
    ThreadServer,
    wait_until,
)

from radixlm.server.app import create_app

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather of a city", "input_schema": PARAMS}
CHAT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}}
CALL_TEXT = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' \
            '</tool_call>'
HI = [{"role": "user", "content": "hi"}]


def blocks_of(message: Any) -> list[dict[str, Any]]:
    """A message's content blocks as plain dicts (the stream helper's parsed blocks carry
    a `parsed_output` the one-shot ones do not)."""
    return [b.model_dump(exclude={"parsed_output"}, exclude_none=True) for b in message.content]


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
def client(served: tuple[ScriptedEngine, ThreadServer]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served[1].base_url, api_key="x", max_retries=0)


@pytest.fixture
def chat(served: tuple[ScriptedEngine, ThreadServer]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].base_url + "/v1", api_key="x", max_retries=0)


# ---------------------------------------------------------------- requests and answers


def test_text_message_fields_usage_and_params(client: anthropic.Anthropic,
                                              fake: ScriptedEngine) -> None:
    fake.script = "Hello there."
    # (anthropic 2.x dropped temperature, top_p and top_k from create(); 0.x sends them)
    r = client.messages.create(model="m", max_tokens=50, messages=HI, system="Be nice.",
                               stop_sequences=["zz"], metadata={"user_id": "u1"},
                               service_tier="standard_only", extra_body={
                                   "temperature": 0.5, "top_p": 0.9, "top_k": 7})
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == "Hello there."
    assert r.stop_reason == "end_turn" and r.stop_sequence is None and r.model == "fake-model"
    sent = fake.calls[-1]
    expected = fake.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be nice."}, *HI], add_generation_prompt=True)
    assert sent["input_ids"] == expected["input_ids"]
    assert sent["sampling_params"] == {"temperature": 0.5, "top_p": 0.9, "top_k": 7,
                                       "stop": ["zz"], "max_new_tokens": 50}
    assert r.usage.input_tokens == len(expected["input_ids"])
    assert r.usage.output_tokens == len("Hello there.")
    assert client.messages.count_tokens(model="m", messages=HI, system="Be nice.") \
        .input_tokens == r.usage.input_tokens


def test_conversation_reaches_the_engine_as_the_chat_route_sends_it(
        client: anthropic.Anthropic, chat: openai.OpenAI, fake: ScriptedEngine) -> None:
    fake.script = "ok"
    client.messages.create(model="m", max_tokens=5, tools=[WEATHER], system=[
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
        {"role": "user", "content": [{"type": "text", "text": "weather"},
                                     {"type": "text", "text": "in Oslo?"}]},
        {"role": "user", "content": "and Bergen?"},  # consecutive turns are combined
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look it up", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
             "input": {"city": "Bergen"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no data"}]},
            {"type": "text", "text": "thanks"}]}])
    via_messages = fake.calls[-1]
    calls = [{"id": f"toolu_{i}", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": c})}}
        for i, c in ((1, "Oslo"), (2, "Bergen"))]
    chat.chat.completions.create(model="m", tools=[CHAT_WEATHER], max_tokens=5, messages=[
        {"role": "system", "content": "You are terse.\nBe brief."},
        {"role": "user", "content": "weather\nin Oslo?\nand Bergen?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "look it up",
         "tool_calls": calls},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"},
        {"role": "user", "content": "thanks"}])
    via_chat = fake.calls[-1]
    assert via_messages["input_ids"] == via_chat["input_ids"]
    assert via_messages["sampling_params"] == via_chat["sampling_params"]
    assert "<tool_response>\nError: no data" in via_messages["text"]


@pytest.mark.parametrize("choice, chat_choice, parallel", [
    ({"type": "auto"}, "auto", None), ({"type": "any"}, "required", None),
    ({"type": "tool", "name": "get_weather"},
     {"type": "function", "function": {"name": "get_weather"}}, None),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ({"type": "none"}, "none", None)])
def test_tool_choice_uses_the_chat_route_tool_grammar(
        client: anthropic.Anthropic, chat: openai.OpenAI, fake: ScriptedEngine,
        choice: dict, chat_choice: Any, parallel: bool | None) -> None:
    client.messages.create(model="m", max_tokens=4, messages=HI, tools=[WEATHER],
                           tool_choice=choice)
    via_messages = fake.calls[-1]
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    chat.chat.completions.create(model="m", max_tokens=4, messages=HI, tools=[CHAT_WEATHER],
                                 tool_choice=chat_choice, **extra)
    via_chat = fake.calls[-1]
    assert via_messages["input_ids"] == via_chat["input_ids"]
    assert via_messages["sampling_params"] == via_chat["sampling_params"]
    if choice["type"] in ("any", "tool"):  # the whole output is the format's calls
        assert set(via_messages["sampling_params"]) & {"ebnf", "structural_tag"}


def test_inert_fields_change_nothing(client: anthropic.Anthropic,
                                    fake: ScriptedEngine) -> None:
    client.messages.create(model="m", max_tokens=4, messages=HI, tools=[WEATHER])
    plain = fake.calls[-1]
    ephemeral = {"type": "ephemeral"}
    client.messages.create(
        model="m", max_tokens=4, tools=[{**WEATHER, "cache_control": ephemeral,
                                         "eager_input_streaming": True}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control":
                                                {**ephemeral, "ttl": "1h"}}]}],
        metadata={"user_id": "u"}, service_tier="auto",
        extra_body={"cache_control": ephemeral, "speed": "standard"})
    assert fake.calls[-1]["input_ids"] == plain["input_ids"]
    assert fake.calls[-1]["sampling_params"] == plain["sampling_params"]
    client.messages.create(model="m", max_tokens=4, messages=HI)
    no_tools = fake.calls[-1]
    client.messages.create(model="m", max_tokens=4, messages=HI, tools=[])
    assert fake.calls[-1]["input_ids"] == no_tools["input_ids"]
    assert fake.calls[-1]["sampling_params"] == no_tools["sampling_params"] == {
        "max_new_tokens": 4}


def test_output_config_format_is_a_strict_json_schema(
        client: anthropic.Anthropic, chat: openai.OpenAI, fake: ScriptedEngine) -> None:
    client.messages.create(model="m", max_tokens=4, messages=HI, output_config={
        "format": {"type": "json_schema", "schema": PARAMS}})
    sent = fake.calls[-1]["sampling_params"]
    chat.chat.completions.create(model="m", max_tokens=4, messages=HI, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": PARAMS, "strict": True}})
    assert sent == fake.calls[-1]["sampling_params"]
    assert json.loads(sent["json_schema"])["additionalProperties"] is False


def test_tool_use_blocks_and_the_next_turn(client: anthropic.Anthropic,
                                           fake: ScriptedEngine) -> None:
    fake.script = CALL_TEXT
    r = client.messages.create(model="m", max_tokens=200, messages=HI, tools=[WEATHER])
    text, call = r.content
    assert text.type == "text" and text.text == "Sure."
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert (call.name, call.input) == ("get_weather", {"city": "Oslo"})
    assert r.stop_reason == "tool_use"
    fake.script = "It is 21 C."
    answer = client.messages.create(model="m", max_tokens=200, tools=[WEATHER], messages=[
        *HI, r.to_param(), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "21 C"}]}])
    assert answer.content[0].text == "It is 21 C." and answer.stop_reason == "end_turn"
    assert fake.calls[-1]["text"].endswith("<tool_response>\n21 C\n</tool_response>\n"
                                           "<assistant>")


def test_a_system_message_in_messages_is_one_where_it_stands(client: anthropic.Anthropic,
                                                             fake: ScriptedEngine) -> None:
    client.messages.create(model="m", max_tokens=2, system="S", messages=HI)
    top_level = fake.calls[-1]["input_ids"]
    client.messages.create(model="m", max_tokens=2, messages=[
        {"role": "system", "content": [{"type": "text", "text": "S"}]}, *HI])
    assert fake.calls[-1]["input_ids"] == top_level


def test_prefill_continues_the_final_assistant_message(client: anthropic.Anthropic,
                                                       fake: ScriptedEngine) -> None:
    fake.script = "B)"
    r = client.messages.create(model="m", max_tokens=5, messages=[
        *HI, {"role": "assistant", "content": "The best answer is ("}])
    assert r.content[0].text == "B)"
    assert fake.calls[-1]["text"].endswith("<user>hi\n<assistant>The best answer is (")
    client.messages.create(model="m", max_tokens=5, messages=[
        *HI, {"role": "assistant", "content": ""}])  # empty: dropped, a new turn
    assert fake.calls[-1]["text"].endswith("<user>hi\n<assistant>")


def test_stop_sequence_and_max_tokens(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="m", max_tokens=50, messages=HI,
                               stop_sequences=["zz", "de"])
    assert (r.content[0].text, r.stop_reason, r.stop_sequence) == ("abc", "stop_sequence",
                                                                   "de")
    r = client.messages.create(model="m", max_tokens=3, messages=HI)
    assert (r.content[0].text, r.stop_reason, r.usage.output_tokens) == ("abc", "max_tokens", 3)
    r = client.messages.create(model="m", max_tokens=0, messages=HI)  # prefill only
    assert (r.content, r.stop_reason, r.usage.output_tokens) == ([], "max_tokens", 0)
    r = client.messages.create(model="m", max_tokens=10_000, messages=HI)  # clamped
    assert r.stop_reason == "model_context_window_exceeded"
    assert r.usage.input_tokens + r.usage.output_tokens == 4096


def test_thinking_blocks(client: anthropic.Anthropic, fake: ScriptedEngine) -> None:
    fake.config = ScriptedConfig(context_length=4096, reasoning_parser="deepseek-r1")
    fake.script = "let me think</think>The answer."
    args = {"model": "m", "max_tokens": 2048, "messages": HI,
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    r = client.messages.create(**args)
    thought, text = r.content
    assert (thought.type, thought.thinking, thought.signature) == ("thinking", "let me think",
                                                                    "")
    assert text.text == "The answer." and r.stop_reason == "end_turn"
    assert fake.calls[-1]["sampling_params"]["thinking_budget"] == 1024
    with client.messages.stream(**args) as stream:
        deltas = "".join(e.delta.thinking for e in stream if e.type == "content_block_delta"
                         and e.delta.type == "thinking_delta")
        final = stream.get_final_message()
    assert deltas == "let me think" and blocks_of(final) == blocks_of(r)
    assert final.usage == r.usage
    hidden = client.messages.create(**{**args, "thinking": {
        "type": "enabled", "budget_tokens": 1024, "display": "omitted"}})
    assert hidden.content[0].thinking == "" and hidden.content[1].text == "The answer."
    r = client.messages.create(model="m", max_tokens=20, messages=HI,
                               thinking={"type": "disabled"})
    assert "thinking_budget" not in fake.calls[-1]["sampling_params"]


# ---------------------------------------------------------------- streaming


def _raw_events(url: str, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event of a POST /v1/messages."""
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers,
                      timeout=30) as r:
        assert r.status_code == 200
        text = r.read().decode()
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_stream_event_order(served, fake: ScriptedEngine) -> None:
    events = _raw_events(served[1].base_url, {"model": "m", "max_tokens": 3, "messages": HI,
                                              "stream": True})
    assert all(name == data["type"] for name, data in events)
    assert [n for n, _ in events] == [
        "message_start", "ping", "content_block_start", *["content_block_delta"] * 3,
        "content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0 and start["id"].startswith("msg_")
    assert [d["delta"]["text"] for _, d in events[3:6]] == ["a", "b", "c"]
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"output_tokens": 3}


def test_stream_final_message_equals_the_one_shot_answer(client: anthropic.Anthropic,
                                                         fake: ScriptedEngine) -> None:
    fake.script = CALL_TEXT
    args = {"model": "m", "max_tokens": 200, "messages": HI, "tools": [WEATHER]}
    one = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.usage == one.usage
    streamed, once = blocks_of(final), blocks_of(one)
    assert streamed[1].pop("id").startswith("toolu_") and once[1].pop("id").startswith("toolu_")
    assert streamed == once  # but for the calls' ids: each answer makes new ones
    assert final.stop_reason == one.stop_reason == "tool_use"
    kinds = [(e.type, getattr(e, "delta", None) and e.delta.type) for e in events
             if e.type.startswith("content_block")]
    assert ("content_block_delta", "input_json_delta") in kinds
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["text", "tool_use"]
    stream_args = {**args, "stop_sequences": ["de"]}
    fake.script = None
    with client.messages.stream(**stream_args) as stream:
        final = stream.get_final_message()
    # (the fake engine does not hold back a stop string's start while streaming; the real
    # one does, test_server_messages_real.py checks the text)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "de")


def test_a_call_cut_by_max_tokens_ends_the_stream_cleanly(client: anthropic.Anthropic,
                                                          fake: ScriptedEngine) -> None:
    fake.script = CALL_TEXT
    with client.messages.stream(model="m", max_tokens=CALL_TEXT.index("Oslo") + 2,
                                messages=HI, tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    # the call was streamed as it was written; cut short, the intake reads its text back as
    # content (ToolCallStream), and the stream ends without an error
    assert final.stop_reason == "max_tokens"
    assert [b.type for b in final.content] == ["text", "tool_use", "text"]


def test_an_error_after_the_stream_started_is_an_error_event(
        client: anthropic.Anthropic, fake: ScriptedEngine) -> None:
    fake.script = "!crash"
    with pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model="m", max_tokens=5, messages=HI)
    assert info.value.body["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError) as info, \
            client.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
        list(stream)
    assert info.value.body == {"type": "error", "error": {
        "type": "api_error", "message": "internal error: injected"}}


def test_stream_disconnect_aborts() -> None:
    fake = FakeEngine(context_len=10**6, step_delay=0.01)
    with ThreadServer(create_app(fake)) as server:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        stream = client.messages.create(model="m", max_tokens=100_000, messages=HI,
                                        stream=True)
        rid = next(iter(stream)).message.id.removeprefix("msg_")
        wait_until(lambda: rid in fake.running, "the request to start")
        stream.close()
        wait_until(lambda: rid in fake.aborted, "the server to abort the request")
        wait_until(lambda: rid not in fake.running, "the request to leave the engine")
