"""End to end: a real `radixlm serve` subprocess on the default model (conftest's shared
one), driven by requests/httpx, the `openai` client and the bench client; references are the
model's own transformers tokenizer and jsonschema."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from server_fakes import wait_until

from radixlm.cli import main as cli_main

GREEDY = {"temperature": 0.0}
CONTEXT = 512


@pytest.fixture(scope="module")
def server(real_server) -> tuple[subprocess.Popen, str]:
    """conftest's shared server (context 512, 8192 KV tokens, 16 running requests)."""
    assert real_server.CONTEXT == CONTEXT
    return real_server.proc, real_server.url


@pytest.fixture(scope="module")
def url(server: tuple[subprocess.Popen, str]) -> str:
    return server[1]


@pytest.fixture(scope="module")
def tokenizer(url: str):
    from pathlib import Path

    from radixlm.runtime.weights import load_tokenizer

    return load_tokenizer(Path(httpx.get(url + "/get_model_info").json()["model_path"]))


def sse_chunks(lines: Iterator[str]) -> Iterator[dict | str]:
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


def test_model_info_matches_the_tokenizer(url: str, tokenizer) -> None:
    info = httpx.get(url + "/get_model_info").json()
    assert info["is_generation"] is True and info["context_length"] == CONTEXT
    assert info["chat_template"] == tokenizer.chat_template
    sys_prompt = info["default_system_prompt"]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False)
    assert sys_prompt and sys_prompt in rendered
    toks = httpx.post(url + "/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    assert toks == tokenizer.encode("Hello world", add_special_tokens=False)
    server_info = httpx.get(url + "/get_server_info").json()
    assert server_info["max_running_requests"] == 16
    assert server_info["stats"]["kv_capacity"] >= 8192 - 1


def test_generate_stream_matches_non_stream(url: str, tokenizer) -> None:
    body = {"text": "The capital of France is", "sampling_params": {**GREEDY,
                                                                    "max_new_tokens": 8}}
    # a cold run first: the runs compared below are a cache hit's, the same bits as the
    # cold one's on the server's batch-invariant defaults (conftest checks it), and in
    # the same steps as each other besides
    cold = httpx.post(url + "/generate", json=body, timeout=120).json()
    out = httpx.post(url + "/generate", json=body, timeout=120).json()
    assert out["output_ids"] == cold["output_ids"]
    assert out["text"] == tokenizer.decode(out["output_ids"], skip_special_tokens=True)
    assert out["meta_info"]["prompt_tokens"] == len(
        tokenizer.encode(body["text"], add_special_tokens=False))
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True},
                      timeout=120) as r:
        chunks = list(sse_chunks(r.iter_lines()))
    assert chunks[-1] == "[DONE]"
    texts = [c["text"] for c in chunks[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative
    assert chunks[-2]["text"] == out["text"] and chunks[-2]["output_ids"] == out["output_ids"]


def test_generate_batch_and_logprobs(url: str, tokenizer) -> None:
    prompts = ["One, two, three,", "Hello"]
    out = httpx.post(url + "/generate", json={
        "text": prompts, "sampling_params": {**GREEDY, "max_new_tokens": 3},
        "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
        "return_text_in_logprobs": True}, timeout=120).json()
    assert isinstance(out, list) and len(out) == 2
    for prompt, res in zip(prompts, out, strict=True):
        meta = res["meta_info"]
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        assert [e[1] for e in meta["input_token_logprobs"]] == ids
        assert meta["input_token_logprobs"][0][0] is None
        assert all(e[0] <= 0 for e in meta["input_token_logprobs"][1:])
        assert [e[1] for e in meta["output_token_logprobs"]] == res["output_ids"]
        for chosen, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"],
                               strict=True):
            assert top[0][1] == chosen[1]  # greedy picks the top-1 token
            assert chosen[2] == tokenizer.decode([chosen[1]])


def test_prompt_longer_than_context_is_400(url: str) -> None:
    r = httpx.post(url + "/generate", json={"text": "hello " * (CONTEXT + 10)}, timeout=60)
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_openai_chat_and_stream_usage(url: str, tokenizer) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Say hi."}]
    client.chat.completions.create(model="default", messages=messages, max_tokens=5,
                                   temperature=0)  # warm the cache (see above)
    out = client.chat.completions.create(model="default", messages=messages, max_tokens=5,
                                         temperature=0)
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]
    assert out.usage.prompt_tokens == len(prompt_ids)
    assert 0 < out.usage.completion_tokens <= 5 and out.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="default", messages=messages, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == out.choices[0].message.content  # greedy: same text either way
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    done = client.completions.create(model="default", prompt="1, 2, 3,", max_tokens=4, n=2,
                                     temperature=0, logprobs=1)
    assert done.choices[0].text == done.choices[1].text
    assert len(done.choices[0].logprobs.tokens) == done.usage.completion_tokens // 2


def test_openai_completions_echo_scores_the_prompt(url: str, tokenizer) -> None:
    """echo + logprobs (+ max_tokens 0: what lm-eval-harness sends to score text): the
    prompt's tokens with their logprobs, equal to the native API's input logprobs."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    prompt = "The capital of France is Paris."
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    native = httpx.post(url + "/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True, "logprob_start_len": 0}, timeout=120).json()
    scored = client.completions.create(model="default", prompt=prompt, max_tokens=0, echo=True,
                                       logprobs=1)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == prompt
    assert "".join(lp.tokens) == prompt and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None
    expected = [e[0] for e in native["meta_info"]["input_token_logprobs"][1:]]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert lp.top_logprobs[0] is None and all(len(top) == 1 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    more = client.completions.create(model="default", prompt=prompt, max_tokens=3, echo=True,
                                     logprobs=0, temperature=0)
    lp = more.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + more.usage.completion_tokens
    assert "".join(lp.tokens) == more.choices[0].text


def test_openai_json_schema_response(url: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        out = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "A person as JSON."}],
            max_tokens=48, temperature=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": schema}})
    except openai.BadRequestError as exc:
        if "constraints are unavailable" in str(exc):
            pytest.skip("the engine's constraint backend is not available yet")
        raise
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_health_answers_during_a_generation(url: str) -> None:
    body = {"text": "Count:", "stream": True, "rid": "long-one",
            "sampling_params": {**GREEDY, "max_new_tokens": 200, "ignore_eos": True}}
    with httpx.Client(base_url=url, timeout=120) as c, c.stream("POST", "/generate",
                                                                json=body) as r:
        chunks = sse_chunks(r.iter_lines())
        next(chunks)
        assert c.get("/health").status_code == 200
        # abort right after /health answered: had the loop been blocked until the
        # generation ended, the request would have finished by length instead
        assert c.post("/abort_request", json={"rid": "long-one"}).status_code == 200
        after = list(chunks)
    assert after[-1] == "[DONE]"
    final = after[-2]["meta_info"]
    assert final["finish_reason"]["type"] == "abort" and final["completion_tokens"] < 200


def test_client_disconnect_aborts_and_frees_kv(url: str) -> None:
    before = httpx.get(url + "/get_server_info").json()["stats"]
    body = {"text": "Tell a long story.", "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
        chunks = sse_chunks(r.iter_lines())
        next(chunks)
        next(chunks)

    def idle() -> bool:
        s = httpx.get(url + "/get_server_info").json()["stats"]
        return s["num_running"] == 0 and s["num_waiting"] == 0

    wait_until(idle, "the aborted request to leave the engine", limit_s=60)
    after = httpx.get(url + "/get_server_info").json()["stats"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 400
    assert after["kv_used_tokens"] == after["tree_size"]  # nothing held by a request


def test_metrics_after_requests(url: str) -> None:
    text = httpx.get(url + "/metrics").text
    for name in ("radixlm_requests_total", "radixlm_generation_tokens_total",
                 "radixlm_time_to_first_token_seconds_count", "radixlm_kv_usage_ratio",
                 "radixlm_e2e_request_latency_seconds_count", "radixlm_num_queued_requests"):
        assert name in text, name
    gen = [ln for ln in text.splitlines() if ln.startswith("radixlm_generation_tokens_total")]
    assert float(gen[0].split()[-1]) > 0


@pytest.mark.parametrize("backend", ["radixlm", "openai"])
def test_bench_serving(url: str, backend: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = cli_main(["bench", "serving", "--base-url", url, "--backend", backend,
                     "--num-prompts", "3", "--input-len", "12", "--output-len", "3",
                     "--max-concurrency", "3", "--dataset", "shared-prefix",
                     "--output-json", str(out)])
    summary = json.loads(out.read_text())
    assert code == 0 and summary["completed"] == 3 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 9  # ignore_eos: exactly output-len each
    assert summary["ttft_ms"]["p50"] > 0 and summary["e2e_ms"]["p99"] >= summary["ttft_ms"]["p99"]


def test_sigterm_drains_and_exits_0(server: tuple[subprocess.Popen, str]) -> None:
    proc, url = server
    body = {"text": "Hi", "stream": True,
            "sampling_params": {**GREEDY, "max_new_tokens": 8, "ignore_eos": True}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
        chunks = sse_chunks(r.iter_lines())
        next(chunks)
        proc.send_signal(signal.SIGTERM)
        rest = list(chunks)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert proc.wait(timeout=60) == 0
