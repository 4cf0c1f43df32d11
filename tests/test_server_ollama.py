"""The Ollama API (`/api/*`) through the official `ollama` client and raw HTTP, against a
scripted fake engine: the model routes' shapes; chat and generate answers and their NDJSON
chunk sequence; options, format, think and tools as they reach the engine (the same tokens
and params as the Chat Completions route for the same conversation); `/api/embed` and
`/api/embeddings` (the vectors `/v1/embeddings` gives, truncation to the context); every 400
and 404 in Ollama's error shape, 401 / 413 / 429 too; a client that leaves has its request
aborted. The real model's calls are in test_server_ollama_real.py."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import openai
import pytest
from server_fakes import (
    EMBED_DIM,
    FakeTokenizer,
    ScriptedConfig,
    ScriptedEngine,
    ThreadServer,
    wait_until,
)

from radixlm.server.app import create_app
from radixlm.server.ollama_request import _NEUTRAL
from radixlm.server.state import ServerSettings

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}}
CALL_TEXT = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' \
            '</tool_call>'
HI = [{"role": "user", "content": "hi"}]
MODEL = "fake-model"


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
def client(served: tuple[ScriptedEngine, ThreadServer]) -> ollama.Client:
    return ollama.Client(host=served[1].base_url)


@pytest.fixture
def url(served: tuple[ScriptedEngine, ThreadServer]) -> str:
    return served[1].base_url


def _error(url: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    r = httpx.post(url + path, content=json.dumps(body),  # (escapes lone surrogates)
                   headers={"Content-Type": "application/json"})
    assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str), r.text
    return r.status_code, r.json()["error"]


def _lines(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in r.iter_lines() if line]


# ---------------------------------------------------------------- the model routes


def test_version_tags_ps_show(client: ollama.Client, url: str) -> None:
    assert httpx.get(url + "/api/version").json()["version"].count(".") == 2
    [listed] = client.list().models
    assert listed.model == "fake-model:latest" and len(listed.digest) == 64
    [loaded] = client.ps().models
    assert (loaded.model, loaded.context_length) == ("fake-model:latest", 4096)
    assert loaded.expires_at.year > 2200 and loaded.digest == listed.digest
    for name in ("fake-model", "fake-model:latest", "default"):
        shown = client.show(name)
        assert shown.template == FakeTokenizer.chat_template
        assert "tools" in shown.capabilities and "thinking" not in shown.capabilities
    with pytest.raises(ollama.ResponseError) as err:
        client.show("llama3")
    assert err.value.status_code == 404 and "llama3" in err.value.error
    assert _error(url, "/api/show", {"model": MODEL, "verbose": True})[1].startswith("verbose")
    assert _error(url, "/api/pull", {"model": MODEL})[0] == 404  # not served: Ollama's shape


# ---------------------------------------------------------------- chat and generate


def test_chat_answer_counts_and_durations(client: ollama.Client,
                                          fake: ScriptedEngine) -> None:
    fake.script = "Hello there."
    r = client.chat(model=MODEL, messages=[{"role": "system", "content": "Be nice."}, *HI])
    assert (r.message.role, r.message.content) == ("assistant", "Hello there.")
    assert r.model == "fake-model:latest" and r.created_at.endswith("Z")
    expected = fake.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be nice."}, *HI], add_generation_prompt=True)
    assert fake.calls[-1]["input_ids"] == expected["input_ids"]
    assert (r.done, r.done_reason) == (True, "stop")
    assert (r.prompt_eval_count, r.eval_count) == (len(expected["input_ids"]), 12)
    # the fake's timings: ttft 5 ms of an engine time of 10 ms
    assert (r.prompt_eval_duration, r.eval_duration) == (5_000_000, 5_000_000)
    assert r.total_duration >= r.load_duration >= 0


def test_stream_is_the_default_and_its_chunks_join_to_the_answer(
        client: ollama.Client, fake: ScriptedEngine, url: str) -> None:
    fake.script = "abc"
    lines = _lines(url, "/api/chat", {"model": MODEL, "messages": HI})  # no "stream"
    assert [line["done"] for line in lines] == [False, False, False, True]
    assert [line["message"]["content"] for line in lines] == ["a", "b", "c", ""]
    assert all(line["message"]["role"] == "assistant" for line in lines)
    last = lines[-1]
    assert last["done_reason"] == "stop" and last["eval_count"] == 3
    assert "done_reason" not in lines[0] and "eval_count" not in lines[0]
    whole = client.chat(model=MODEL, messages=HI, stream=False)
    assert whole.message.content == "abc"
    assert (whole.prompt_eval_count, whole.eval_count) == (last["prompt_eval_count"], 3)
    fake.script = "abcdef"
    gen = _lines(url, "/api/generate", {"model": MODEL, "prompt": "hi",
                                        "options": {"num_predict": 4}})
    assert "".join(line["response"] for line in gen) == "abcd"
    assert gen[-1]["done_reason"] == "length" and "message" not in gen[-1]


def test_generate_templated_and_raw(client: ollama.Client, fake: ScriptedEngine) -> None:
    fake.script = "Paris."
    r = client.generate(model=MODEL, prompt="Capital of France?", system="Be brief.")
    assert r.response == "Paris." and r.done_reason == "stop"
    expected = fake.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Capital of France?"}], add_generation_prompt=True)
    assert fake.calls[-1]["input_ids"] == expected["input_ids"]
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                          options={"num_predict": 3})
    assert fake.calls[-1]["text"] == "The capital of France is"
    assert raw.response == "Par" and raw.prompt_eval_count == len("The capital of France is")
    assert fake.calls[-1]["sampling_params"]["max_new_tokens"] == 3


def test_nothing_to_generate_answers_load(client: ollama.Client, fake: ScriptedEngine) -> None:
    before = len(fake.calls)
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"
    r = client.generate(model=MODEL, keep_alive="10m")
    assert (r.done, r.done_reason, r.response) == (True, "load", "")
    assert len(fake.calls) == before  # nothing reached the engine


def test_options_reach_the_engine(client: ollama.Client, fake: ScriptedEngine) -> None:
    client.chat(model=MODEL, messages=HI, keep_alive=-1, options={
        "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.05, "seed": 11,
        "num_predict": 9, "stop": ["zz"], "repeat_penalty": 1.2, "presence_penalty": 0.3,
        "frequency_penalty": 0.4, "num_ctx": 4096, "num_keep": 5, "repeat_last_n": -1})
    assert fake.calls[-1]["sampling_params"] == {
        "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.05, "seed": 11,
        "max_new_tokens": 9, "stop": ["zz"], "repetition_penalty": 1.2,
        "presence_penalty": 0.3, "frequency_penalty": 0.4}
    # seed -1 is random, num_predict -1 the rest of the context; neutral options change
    # nothing (Ollama's defaults), repeat_last_n is free without a penalty
    r = client.chat(model=MODEL, messages=HI, options={
        "seed": -1, "num_predict": -1, "mirostat": 0, "mirostat_tau": 5.0, "num_gpu": -1,
        "tfs_z": 1.0, "typical_p": 1.0, "numa": False, "use_mmap": True, "num_thread": 0,
        "repeat_last_n": 64, "penalize_newline": True})
    assert fake.calls[-1]["sampling_params"] == {
        "max_new_tokens": 4096 - r.prompt_eval_count}


@pytest.mark.parametrize("name", sorted(_NEUTRAL))
def test_an_option_we_cannot_honour_is_a_400_naming_it(url: str, name: str) -> None:
    neutral = _NEUTRAL[name][0]
    value = (not neutral) if isinstance(neutral, bool) else neutral + 3
    status, message = _error(url, "/api/chat", {"model": MODEL, "messages": HI,
                                                "options": {name: value}})
    assert status == 400 and message.startswith(f"options.{name}:"), message


@pytest.mark.parametrize("path, body, field", [
    ("/api/chat", {"options": {"num_ctx": 4097}}, "options.num_ctx"),
    ("/api/chat", {"options": {"mirostat_x": 1}}, "options.mirostat_x"),
    ("/api/chat", {"options": {"repeat_last_n": 64, "repeat_penalty": 1.1}},
     "options.repeat_last_n"),
    ("/api/chat", {"options": {"temperature": 3}}, "options.temperature"),
    ("/api/chat", {"options": {"num_predict": -3}}, "options.num_predict"),
    ("/api/chat", {"format": "xml"}, "format"),
    ("/api/chat", {"think": "high"}, "think"),
    ("/api/chat", {"think": True}, "think"),  # no reasoning parser
    ("/api/chat", {"keep_alive": "soon"}, "keep_alive"),
    ("/api/chat", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/api/chat", {"tool_choice": "auto"}, "tool_choice"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "messages[0].images"),
    ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "name": "n"}]},
     "messages[0].name"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "thinking": "t"}]},
     "messages[0].thinking"),
    ("/api/chat", {"messages": [*HI, {"role": "assistant", "tool_calls": [{"function": {
        "name": "f", "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ("/api/chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object"}}}] * 2}, "tools"),
    ("/api/chat", {"tools": [WEATHER], "format": "json"}, "format"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, "context"),
    ("/api/generate", {"prompt": "x", "images": ["aGk="]}, "images"),
    ("/api/generate", {"prompt": "x", "width": 64}, "width"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, "system"),
    ("/api/generate", {"prompt": "x", "raw": True, "think": False}, "think"),
    ("/api/generate", {"prompt": "x", "options": {"stop": ["\ud800"]}}, "options.stop"),
])
def test_every_400_names_its_field(url: str, path: str, body: dict, field: str) -> None:
    status, message = _error(url, path, {"model": MODEL, "messages": HI, **body}
                             if path == "/api/chat" else {"model": MODEL, **body})
    assert status == 400 and field in message, message


def test_unknown_model_is_a_404(url: str) -> None:
    for path, body in (("/api/chat", {"messages": HI}), ("/api/generate", {"prompt": "x"})):
        status, message = _error(url, path, {"model": "llama3:8b", **body})
        assert status == 404 and "llama3:8b" in message


def test_num_ctx_at_the_context_length_is_accepted(client: ollama.Client) -> None:
    assert client.chat(model=MODEL, messages=HI, options={"num_ctx": 4096}).done


@pytest.mark.parametrize("stream", [False, True])
def test_format_json_and_schema(client: ollama.Client, fake: ScriptedEngine, url: str,
                                stream: bool) -> None:
    fake.script = '{"city": "Oslo"}'
    out = client.chat(model=MODEL, messages=HI, format="json", stream=stream)
    text = "".join(p.message.content for p in out) if stream else out.message.content
    assert json.loads(text) == {"city": "Oslo"}
    assert fake.calls[-1]["sampling_params"]["json_schema"] == json.dumps({"type": "object"})
    out = client.generate(model=MODEL, prompt="x", format=PARAMS, stream=stream)
    assert stream == (not isinstance(out, ollama.GenerateResponse)) and list(out)
    assert json.loads(fake.calls[-1]["sampling_params"]["json_schema"]) == PARAMS
    # a schema that does not compile is a 400 naming format, streamed or not
    status, message = _error(url, "/api/chat", {"model": MODEL, "messages": HI,
                                                "stream": stream,
                                                "format": {**PARAMS, "x": "!bad"}})
    assert status == 400 and message.startswith("format:"), message


def test_tool_calls_round_trip(client: ollama.Client, fake: ScriptedEngine, url: str) -> None:
    fake.script = CALL_TEXT
    r = client.chat(model=MODEL, messages=HI, tools=[WEATHER])
    assert r.message.content == "Sure." and r.done_reason == "stop"
    [call] = r.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Oslo"})
    lines = _lines(url, "/api/chat", {"model": MODEL, "messages": HI, "tools": [WEATHER]})
    streamed = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert [c["function"] for c in streamed] == [{"index": 0, "name": "get_weather",
                                                  "arguments": {"city": "Oslo"}}]
    assert "".join(line["message"]["content"] for line in lines) == "Sure."
    # the call and its result go back: the engine gets what the chat route sends
    # (raw HTTP: the client's Tool model reorders the schema's keys, which the prompt shows)
    fake.script = "It is 21 C."
    answer = httpx.post(url + "/api/chat", json={"model": MODEL, "stream": False,
                                                 "tools": [WEATHER], "messages": [
        *HI, r.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "21 C", "tool_name": "get_weather"}]}).json()
    assert answer["message"]["content"] == "It is 21 C."
    via_ollama = fake.calls[-1]
    chat = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    chat.chat.completions.create(model="m", tools=[WEATHER], messages=[
        *HI, {"role": "assistant", "content": "Sure.", "tool_calls": [{
            "id": "call_1_0", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "21 C"}])
    assert via_ollama["input_ids"] == fake.calls[-1]["input_ids"]
    assert via_ollama["sampling_params"] == fake.calls[-1]["sampling_params"]
    assert "21 C" in via_ollama["text"]


def test_thinking_with_a_reasoning_parser(client: ollama.Client, fake: ScriptedEngine,
                                          url: str) -> None:
    fake.config = ScriptedConfig(context_length=4096, reasoning_parser="deepseek-r1")
    fake.script = "let me think</think>The answer."
    r = client.chat(model=MODEL, messages=HI, think=True)
    assert (r.message.thinking, r.message.content) == ("let me think", "The answer.")
    lines = _lines(url, "/api/chat", {"model": MODEL, "messages": HI, "think": True})
    assert "".join(line["message"].get("thinking", "") for line in lines) == "let me think"
    assert "".join(line["message"]["content"] for line in lines) == "The answer."
    g = client.generate(model=MODEL, prompt="x", think=True)
    assert (g.thinking, g.response) == ("let me think", "The answer.")
    assert "thinking" in client.show(MODEL).capabilities


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs(client: ollama.Client, fake: ScriptedEngine, stream: bool) -> None:
    fake.script = "abc"
    out = client.chat(model=MODEL, messages=HI, logprobs=True, top_logprobs=2, stream=stream)
    lps = [lp for p in out for lp in (p.logprobs or [])] if stream else out.logprobs
    assert [lp.token for lp in lps] == ["a", "b", "c"]
    assert all(len(lp.top_logprobs) == 2 and lp.logprob == -0.5 for lp in lps)


# ---------------------------------------------------------------- key, limits, aborts


@pytest.mark.parametrize("call", ["chat", "generate", "embed", "embeddings"])
def test_api_key_body_cap_and_queue_bound_in_ollama_shape(call: str) -> None:
    fake = ScriptedEngine(context_len=4096, max_queued_requests=1)
    fake.forced_waiting = 1  # the waiting queue is full
    server = ThreadServer(create_app(fake, ServerSettings(api_key="k", max_body_bytes=2000)))
    server.start()
    body, text = {"chat": ({"messages": HI, "stream": False}, "messages"),
                  "generate": ({"prompt": "hi", "stream": False}, "prompt"),
                  "embed": ({"input": "hi"}, "input"),
                  "embeddings": ({"prompt": "hi"}, "prompt")}[call]
    path, body = f"/api/{call}", {"model": MODEL, **body}
    try:
        r = httpx.post(server.base_url + path, json=body)
        assert r.status_code == 401 and set(r.json()) == {"error"}
        keyed = ollama.Client(host=server.base_url, headers={"Authorization": "Bearer k"})
        with pytest.raises(ollama.ResponseError) as err:
            getattr(keyed, call)(**{k: v for k, v in body.items() if k != "stream"})
        assert err.value.status_code == 429  # the admission bound, as for chat completions
        big = {**body, text: "x" * 3000 if text != "messages" else [
            {"role": "user", "content": "x" * 3000}]}
        big = httpx.post(server.base_url + path, headers={"Authorization": "Bearer k"},
                         json=big)
        assert big.status_code == 413 and set(big.json()) == {"error"}
        assert httpx.get(server.base_url + "/api/tags").status_code == 401
        assert fake.calls == []
    finally:
        server.stop()


def _raw_request(url: str, body: dict[str, Any], path: str = "/api/chat") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_has_its_request_aborted(fake: ScriptedEngine, url: str,
                                                      stream: bool) -> None:
    fake.step_delay = 0.02  # 26 letters a second... of a 4000-token answer
    before = len(fake.calls)
    sock = _raw_request(url, {"model": MODEL, "messages": HI, "stream": stream})
    wait_until(lambda: len(fake.calls) > before, "the request to reach the engine")
    if stream:
        assert b"application/x-ndjson" in sock.recv(4096)
    rid = fake.calls[-1]["rid"]
    sock.close()
    wait_until(lambda: rid in fake.aborted, "the engine request to be aborted")
    wait_until(lambda: rid not in fake.running, "its KV to be freed")


def test_a_stream_left_before_its_first_chunk_is_aborted_at_once(fake: ScriptedEngine,
                                                                 url: str) -> None:
    fake.script, fake.step_delay = "abc", 30.0  # the first chunk would come after 30 s
    before = len(fake.calls)
    sock = _raw_request(url, {"model": MODEL, "messages": HI})
    wait_until(lambda: len(fake.calls) > before, "the request to reach the engine")
    rid = fake.calls[-1]["rid"]
    sock.close()  # while the route waits for the first chunk: no byte of the answer is sent
    wait_until(lambda: rid in fake.aborted, "the engine request to be aborted", limit_s=5)


@pytest.mark.parametrize("path, body", [("/api/embed", {"input": ["hi", "there"]}),
                                        ("/api/embeddings", {"prompt": "hi"})])
def test_a_client_that_leaves_has_its_embedding_aborted(fake: ScriptedEngine, url: str,
                                                        path: str, body: dict) -> None:
    fake.step_delay = 30.0  # a "prefill" of 30 s a token
    before = len(fake.calls)
    sock = _raw_request(url, {"model": MODEL, **body}, path)
    n = len(body.get("input", [None]))
    wait_until(lambda: len(fake.calls) == before + n, "the inputs to reach the engine")
    rids = [c["rid"] for c in fake.calls[before:]]
    sock.close()
    wait_until(lambda: set(rids) <= set(fake.aborted), "the engine requests to be aborted",
               limit_s=5)
    wait_until(lambda: not set(rids) & set(fake.running), "their KV to be freed")


# ---------------------------------------------------------------- embeddings


def _v1_embeddings(url: str, texts: list[str], **kw: Any) -> list[list[float]]:
    v1 = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    out = v1.embeddings.create(model="m", input=texts, encoding_format="float", **kw)
    return [d.embedding for d in out.data]


def test_embed_one_and_a_list_as_v1_embeddings(client: ollama.Client, fake: ScriptedEngine,
                                               url: str) -> None:
    one = client.embed(model=MODEL, input="hi")
    assert one.model == "fake-model:latest" and one.prompt_eval_count == 2
    assert one.total_duration >= one.load_duration >= 0
    assert fake.calls[-1]["input_ids"] == fake.tokenizer.encode("hi")
    assert one.embeddings == _v1_embeddings(url, ["hi"])
    assert len(one.embeddings[0]) == EMBED_DIM
    texts = ["hi", "there", "hi"]
    many = client.embed(model="default", input=texts, keep_alive="5m")
    assert many.embeddings == _v1_embeddings(url, texts) and many.prompt_eval_count == 9
    assert many.embeddings[0] == many.embeddings[2] != many.embeddings[1]
    short = client.embed(model=MODEL, input=texts, dimensions=3)
    assert short.embeddings == _v1_embeddings(url, texts, dimensions=3)
    assert client.embed(model=MODEL, input="hi", dimensions=0).embeddings == one.embeddings
    assert client.embeddings(model=MODEL, prompt="hi").embedding == one.embeddings[0]
    # the options that change loading, at Ollama's defaults, change nothing
    assert client.embed(model=MODEL, input="hi", options={
        "num_ctx": 4096, "num_gpu": -1, "num_thread": 0, "use_mmap": True}).embeddings \
        == one.embeddings


def test_embed_truncates_to_the_context_unless_told_not_to(client: ollama.Client,
                                                           fake: ScriptedEngine,
                                                           url: str) -> None:
    long = "abc" * 2000  # 6000 tokens, over the 4096 of the context
    r = client.embed(model=MODEL, input=["hi", long])
    assert r.prompt_eval_count == 2 + 4096
    assert fake.calls[-1]["input_ids"] == fake.tokenizer.encode(long[:4096])
    assert r.embeddings[1] == _v1_embeddings(url, [long[:4096]])[0]
    r = client.embed(model=MODEL, input=long, options={"num_ctx": 10})
    assert r.prompt_eval_count == 10 and fake.calls[-1]["text"] == long[:10]
    for body, field in (({"input": ["hi", long], "truncate": False}, "input[1]"),
                        ({"input": long[:11], "truncate": False, "options": {"num_ctx": 10}},
                         "input")):
        status, message = _error(url, "/api/embed", {"model": MODEL, **body})
        assert status == 400 and message.startswith(f"{field}: has 6000 tokens"
                                                     if "[1]" in field else f"{field}: has 11")
    status, message = _error(url, "/api/embeddings", {"model": MODEL, "prompt": long})
    assert status == 400 and message.startswith("prompt: has 6000 tokens"), message
    assert client.embed(model=MODEL, input=long[:4096], truncate=False).prompt_eval_count == 4096


@pytest.mark.parametrize("path, body, field", [
    ("/api/embed", {}, "input"),
    ("/api/embed", {"input": ""}, "input"),
    ("/api/embed", {"input": []}, "input"),
    ("/api/embed", {"input": ["a", ""]}, "input[1]"),
    ("/api/embed", {"input": [1, 2]}, "input"),
    ("/api/embed", {"input": 5}, "input"),
    ("/api/embed", {"input": "\ud800"}, "input"),
    ("/api/embed", {"input": "x", "truncate": "maybe"}, "truncate"),
    ("/api/embed", {"input": "x", "dimensions": -1}, "dimensions"),
    ("/api/embed", {"input": "x", "dimensions": "4"}, "dimensions"),
    ("/api/embed", {"input": "x", "dimensions": EMBED_DIM + 1}, "dimensions"),
    ("/api/embed", {"input": "x", "keep_alive": "soon"}, "keep_alive"),
    ("/api/embed", {"input": "x", "encoding_format": "float"}, "encoding_format"),
    ("/api/embed", {"input": "x", "options": {"temperature": 0.5}}, "options.temperature"),
    ("/api/embed", {"input": "x", "options": {"num_predict": 8}}, "options.num_predict"),
    ("/api/embed", {"input": "x", "options": {"stop": ["a"]}}, "options.stop"),
    ("/api/embed", {"input": "x", "options": {"num_gpu": 2}}, "options.num_gpu"),
    ("/api/embed", {"input": "x", "options": {"mirostat_x": 1}}, "options.mirostat_x"),
    ("/api/embed", {"input": "x", "options": {"num_ctx": 4097}}, "options.num_ctx"),
    ("/api/embeddings", {}, "prompt"),
    ("/api/embeddings", {"prompt": ""}, "prompt"),
    ("/api/embeddings", {"prompt": ["a"]}, "prompt"),
    ("/api/embeddings", {"prompt": "x", "input": "y"}, "input"),
    ("/api/embeddings", {"prompt": "x", "truncate": True}, "truncate"),
    ("/api/embeddings", {"prompt": "x", "options": {"seed": 1}}, "options.seed"),
])
def test_every_embed_400_names_its_field(url: str, fake: ScriptedEngine, path: str,
                                         body: dict, field: str) -> None:
    before = len(fake.calls)
    status, message = _error(url, path, {"model": MODEL, **body})
    assert status == 400 and message.lstrip("'").startswith(field), message
    assert len(fake.calls) == before  # refused before the engine


def test_embed_unknown_model_is_a_404(url: str) -> None:
    for path, body in (("/api/embed", {"input": "x"}), ("/api/embeddings", {"prompt": "x"})):
        status, message = _error(url, path, {"model": "nomic-embed-text", **body})
        assert status == 404 and "nomic-embed-text" in message
    status, message = _error(url, "/api/embed", {"input": "x"})
    assert status == 400 and message.startswith("model"), message
