"""The Anthropic Messages API on the shared real server (SmolLM2-135M-Instruct), through the
official `anthropic` client: at temperature 0 the text is the Chat Completions route's for
the same conversation; the stream's final message is the one-shot answer; stop sequences,
max_tokens, count_tokens; tool_choice any / tool force a call whose input validates against
the schema, and its result goes back as a tool_result."""

from __future__ import annotations

from typing import Any

import anthropic
import jsonschema
import openai
import pytest

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": PARAMS},
         {"name": "get_time", "description": "Local time in a city", "input_schema": PARAMS}]
SYSTEM = "You are a helpful assistant. Answer in one sentence."
QUESTION = [{"role": "user", "content": "Name a colour of the sky."}]
GREEDY = {"temperature": 0}  # sent as an extra: anthropic 2.x dropped the argument


@pytest.fixture(scope="module")
def client(real_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=real_server.url, api_key="x", max_retries=0,
                               timeout=120)


@pytest.fixture(scope="module")
def chat(real_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.url + "/v1", api_key="x", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def one_shot(client: anthropic.Anthropic) -> anthropic.types.Message:
    return client.messages.create(model="m", max_tokens=16, system=SYSTEM, messages=QUESTION,
                                  extra_body=GREEDY)


def _text(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_text_equals_the_chat_route_at_temperature_0(one_shot: Any,
                                                     chat: openai.OpenAI) -> None:
    r = chat.chat.completions.create(model="m", max_tokens=16, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, *QUESTION])
    assert _text(one_shot).strip() and _text(one_shot) == r.choices[0].message.content
    assert one_shot.usage.input_tokens == r.usage.prompt_tokens
    assert one_shot.usage.output_tokens == r.usage.completion_tokens
    expected = {"length": "max_tokens", "stop": "end_turn"}[r.choices[0].finish_reason]
    assert one_shot.stop_reason == expected


def test_stream_final_message_equals_the_one_shot(client: anthropic.Anthropic,
                                                  one_shot: Any) -> None:
    with client.messages.stream(model="m", max_tokens=16, system=SYSTEM, messages=QUESTION,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == _text(final) == _text(one_shot)
    assert (final.stop_reason, final.stop_sequence) == (one_shot.stop_reason, None)
    assert final.usage.input_tokens == one_shot.usage.input_tokens
    assert final.usage.output_tokens == one_shot.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_and_max_tokens(client: anthropic.Anthropic, one_shot: Any,
                                      stream: bool) -> None:
    text = _text(one_shot)
    stop = text[len(text) // 2:len(text) // 2 + 3]  # a piece of the greedy answer
    args = {"model": "m", "max_tokens": 16, "system": SYSTEM, "messages": QUESTION,
            "extra_body": GREEDY, "stop_sequences": ["\u2603", stop]}
    if stream:
        with client.messages.stream(**args) as s:
            r = s.get_final_message()
    else:
        r = client.messages.create(**args)
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert _text(r) == text[:text.index(stop)]
    short = client.messages.create(**{**args, "max_tokens": 3, "stop_sequences": []})
    assert (short.stop_reason, short.usage.output_tokens) == ("max_tokens", 3)


def test_count_tokens_is_the_prompt(client: anthropic.Anthropic, one_shot: Any) -> None:
    n = client.messages.count_tokens(model="m", system=SYSTEM, messages=QUESTION)
    assert n.input_tokens == one_shot.usage.input_tokens
    with_tools = client.messages.count_tokens(model="m", system=SYSTEM, messages=QUESTION,
                                              tools=TOOLS)
    r = client.messages.create(model="m", max_tokens=1, system=SYSTEM, messages=QUESTION,
                               tools=TOOLS, extra_body=GREEDY)
    assert with_tools.input_tokens == r.usage.input_tokens > n.input_tokens + 20


def test_tool_choice_forces_a_call_and_the_result_goes_back(
        client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model="m", max_tokens=60, messages=ask, tools=TOOLS,
                                   tool_choice={"type": "any",
                                                "disable_parallel_tool_use": True},
                                   extra_body=GREEDY)
    calls = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(calls) == 1
    assert calls[0].name in ("get_weather", "get_time") and calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, {**PARAMS, "additionalProperties": False})
    named = client.messages.create(model="m", max_tokens=60, messages=ask, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "get_time"},
                                   extra_body=GREEDY)
    [call] = [b for b in named.content if b.type == "tool_use"]
    assert call.name == "get_time" and named.stop_reason == "tool_use"
    jsonschema.validate(call.input, {**PARAMS, "additionalProperties": False})
    answer = client.messages.create(
        model="m", max_tokens=8, tools=TOOLS, tool_choice={"type": "none"}, extra_body=GREEDY,
        messages=[*ask, first.to_param(), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": calls[0].id, "content": "21 C, sunny"}]}])
    assert [b.type for b in answer.content] == ["text"] and _text(answer)
    alone = client.messages.count_tokens(model="m", messages=ask)
    assert answer.usage.input_tokens > alone.input_tokens + 10  # the call and its result
