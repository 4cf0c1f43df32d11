"""Structured output v2 on the real model (default llguidance backend), served in-process:
EBNF grammars (GBNF and Lark) and structural tags on the native and OpenAI APIs, and OpenAI
tool calling through the official `openai` client (required / named / auto / none, parallel,
streamed deltas, a two-turn loop with a `role: "tool"` result). References: jsonschema for
arguments, Python's own parser for arithmetic, json for the JSON-like grammar."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from server_fakes import ThreadServer

from radixlm.server.app import create_app

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

ARITH_GBNF = r'''
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= num | "(" expr ")"
num ::= [1-9] [0-9]?
'''
JSONISH_LARK = r'''
start: value
value: obj | arr | STRING | NUMBER
obj: "{" (pair ("," pair)*)? "}"
pair: STRING ":" value
arr: "[" (value ("," value)*)? "]"
STRING: /"[a-z]{1,8}"/
NUMBER: /[0-9]{1,3}/
'''


@pytest.fixture(scope="module")
def url(engine_default) -> Iterator[str]:
    with ThreadServer(create_app(engine_default)) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_ebnf_gbnf_and_lark_native(url: str) -> None:
    prompts = ["Write an arithmetic expression:", "Write a JSON object about a cat:"]
    out = httpx.post(url + "/generate", json={"text": prompts, "sampling_params": [
        {"ebnf": ARITH_GBNF, "temperature": 0.7, "seed": 1, "max_new_tokens": 40},
        {"ebnf": JSONISH_LARK, "temperature": 0.7, "seed": 2, "max_new_tokens": 60}]},
        timeout=120).json()
    arith, jsonish = out[0], out[1]
    if arith["meta_info"]["finish_reason"]["type"] == "stop":
        expr = arith["text"]
        assert re.fullmatch(r"[0-9+\-*/()]+", expr), expr
        ast.parse(expr, mode="eval")  # balanced, well-formed
    if jsonish["meta_info"]["finish_reason"]["type"] == "stop":
        json.loads(jsonish["text"])
    assert "stop" in (arith["meta_info"]["finish_reason"]["type"],
                      jsonish["meta_info"]["finish_reason"]["type"])


def test_ebnf_that_cannot_finish_ends_with_length(url: str) -> None:
    out = httpx.post(url + "/generate", json={"text": "Count:", "sampling_params": {
        "ebnf": 'root ::= "a" [0-9]{40}', "max_new_tokens": 5, "temperature": 0}},
        timeout=60).json()
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert re.fullmatch(r"a[0-9]*", out["text"])


@pytest.mark.parametrize("body, needle", [
    ({"ebnf": 'root ::= "a" ('}, "ebnf"),
    ({"ebnf": "start: foo"}, "foo"),
    ({"structural_tag": {"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}],
                         "triggers": ["<g"]}}, "triggers"),
])
def test_bad_grammars_are_400(url: str, body: dict, needle: str) -> None:
    r = httpx.post(url + "/generate", json={"text": "x", "sampling_params": body}, timeout=30)
    assert r.status_code == 400 and needle in r.text, r.text


def test_structural_tag_openai_response_format(client: openai.OpenAI) -> None:
    schema = PARAMS["get_weather"]
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Call get_weather for Paris using "
                              "<function=get_weather>{...}</function>."}],
        max_tokens=40, temperature=0,
        response_format={"type": "structural_tag", "triggers": ["<function="],
                         "structures": [{"begin": "<function=get_weather>", "schema": schema,
                                         "end": "</function>"}]})
    text = out.choices[0].message.content
    for m in re.finditer(r"<function=get_weather>(.*?)</function>", text, re.S):
        jsonschema.validate(json.loads(m.group(1)), schema)
    assert "<function=" not in re.sub(r"<function=get_weather>.*?</function>", "", text,
                                      flags=re.S) or out.choices[0].finish_reason == "length"


def _check_call(call, name: str | None = None) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert name is None or call.function.name == name
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_constrains_arguments(client: openai.OpenAI, choice) -> None:
    out = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=80,
        temperature=0, parallel_tool_calls=False)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert len(c.message.tool_calls) == 1
    _check_call(c.message.tool_calls[0], None if choice == "required" else "get_time")


def test_parallel_required_and_two_turn_loop(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80,
        temperature=0)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    for call in msg.tool_calls:
        _check_call(call)
    assert len({c.id for c in msg.tool_calls}) == len(msg.tool_calls)
    history = ASK + [msg.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temp_c": 21})}
        for c in msg.tool_calls]
    second = client.chat.completions.create(model="m", messages=history, tools=[WEATHER, TIME],
                                            tool_choice="none", max_tokens=8, temperature=0)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    alone = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice="none", max_tokens=1)
    # the call and the result went back into the prompt
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_auto_allows_text_or_a_valid_call(client: openai.OpenAI) -> None:
    for messages in (ASK, [{"role": "user", "content": "Say hello."}]):
        out = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER],
                                             max_tokens=40, temperature=0)
        c = out.choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            for call in c.message.tool_calls:
                _check_call(call, "get_weather")
        else:
            assert c.message.content and "<tool_call>" not in c.message.content \
                or c.finish_reason == "length"


def test_streamed_tool_call_deltas_match_non_streamed(client: openai.OpenAI) -> None:
    kwargs = {"model": "m", "messages": ASK, "tools": [WEATHER, TIME], "max_tokens": 80,
              "temperature": 0, "tool_choice": {"type": "function",
                                                "function": {"name": "get_weather"}}}
    full = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            assert not ch.delta.content
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": "", "args": ""})
                if d.id:
                    assert entry["id"] is None and d.type == "function"
                    entry["id"] = d.id
                if d.function and d.function.name:
                    entry["name"] += d.function.name
                if d.function and d.function.arguments:
                    entry["args"] += d.function.arguments
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["args"]) == json.loads(full.function.arguments)


@pytest.mark.parametrize("kwargs, needle", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "name"),
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"minimum": "x"}}}}}]},
     "parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "nope"),
    ({"tool_choice": "required"}, "needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined"),
    ({"tools": [{"type": "retrieval"}]}, "function"),
])
def test_bad_tool_definitions_are_400(client: openai.OpenAI, kwargs: dict, needle: str) -> None:
    with pytest.raises(openai.BadRequestError, match=needle):
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **kwargs)


def test_generic_format_round_trip_without_a_model() -> None:
    from radixlm.formats.tool_parsers import ToolCallStream, get_parser, parse_tools
    from radixlm.server.tool_calls import render_messages

    parser = get_parser("qwen25")
    auto = parse_tools([WEATHER], None, None, parser)
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    out = render_messages(history, parser, auto, native=False)
    assert out[0]["role"] == "system" and '"get_weather"' in out[0]["content"]
    assert out[2]["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": '
                                 '{"city": "Oslo"}}\n</tool_call>')
    assert out[3] == {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>"}
    text = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n' \
           '</tool_call>'
    content, calls = auto.parse(text)
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == \
        {"city": "Rome"}
    assert auto.parse("plain <tool_call>{broken</tool_call>") == (
        "plain <tool_call>{broken</tool_call>", [])
    stream = ToolCallStream(auto, incremental=False)
    assert stream.feed("Sure. <tool_ca", False) == ("Sure.", [])  # a possible call held back
    assert stream.feed("Sure. <tool_cab>", False) == (" <tool_cab>", [])  # it was not one
    required = parse_tools([WEATHER], "required", True, parser)
    assert required.parse('<tool_call>\n{"name": "get_weather", "arguments": {}}\n'
                          '</tool_call>')[0] is None
