"""A reasoning model end to end: a tiny random-weight Qwen3 whose tokenizer has ``<think>`` and
``</think>`` as single tokens and whose chat template opens ``<think>`` (Qwen3-style, with
``enable_thinking``), served with ``--reasoning-parser qwen3``.

- in process, 200 randomized requests (random prompts, budgets and sampling settings, a
  JSON schema each): the thinking block ends within ``thinking_budget`` tokens every time,
  and the answer is valid under the schema every time (jsonschema);
- through the official ``openai`` client: ``reasoning_content`` within the budget (counted on
  the returned token logprobs) and ``content`` valid under ``response_format``; streamed
  ``reasoning_content`` / ``content`` deltas join to the same split; ``enable_thinking: false``
  via ``chat_template_kwargs``; the bad inputs named in a 400;
- ``/generate`` in SGLang's shape (``text`` + ``reasoning_text``, or the raw text), SGLang's
  ``/separate_reasoning``, and the DSL's ``separate_reasoning`` over the engine and HTTP.
"""

from __future__ import annotations

import json
import random
import re

import httpx
import jsonschema
import openai
import pytest
import torch
from server_fakes import ThreadServer

import radixlm.lang as sgl
from radixlm.constraints.reasoning import (
    ANSWER,
    REASONING,
    ReasoningParser,
    get_format,
    output_start,
)
from radixlm.runtime.engine import Engine
from radixlm.server.app import create_app

# Qwen3's template, reduced to what this test needs; with enable_thinking (the default) the
# generation prompt opens the block, as Qwen3-Thinking's does; without, it closes an empty
# one, as Qwen3's does.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking "
    "is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}")
SCHEMA = {"type": "object", "properties": {
    "answer": {"type": "integer", "minimum": 0, "maximum": 999},
    "sure": {"type": "boolean"}, "unit": {"enum": ["m", "s", "kg"]},
    "note": {"type": "string", "maxLength": 6}},
    "required": ["answer", "sure", "unit", "note"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
WORDS = "add the numbers then think about units and say if you are sure of it".split()


def _build(out, tokenizer, family: str = "qwen3"):
    """The tiny reasoning model: Qwen3, or the same shapes as Llama, with the same tokenizer
    and template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen3Config

    tokenizer.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_tokens(["<think>", "</think>"])  # single, non-special tokens, as in Qwen3
    tok.chat_template = QWEN3_TEMPLATE
    tok.save_pretrained(out)
    config_cls = {"qwen3": Qwen3Config, "llama": LlamaConfig}[family]
    cfg = config_cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.3)
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("tiny-qwen3-thinking")
    _build(out, tokenizer)
    return str(out)


@pytest.fixture(scope="module")
def engine(model_path):
    with Engine(model_path, reasoning_parser="qwen3", dtype="float32", weight_quant="none",
                max_total_tokens=16384, max_running_requests=64,
                log_level="warning") as e:
        yield e


@pytest.fixture(scope="module")
def server(engine):
    with ThreadServer(create_app(engine)) as srv:
        yield srv


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _think_ids(tok) -> tuple[int, int]:
    return tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")


def _reasoning_tokens(output_ids: list[int], end_id: int) -> int:
    """Output tokens before the end of thinking (all of them when there is none)."""
    return output_ids.index(end_id) if end_id in output_ids else len(output_ids)


def test_budget_holds_and_answers_validate_over_200_random_requests(engine):
    tok = engine.tokenizer
    fmt = get_format("qwen3")
    _, end_id = _think_ids(tok)
    rng = random.Random(2026)
    prompts, params, budgets, thinking = [], [], [], []
    for i in range(200):
        think = rng.random() < 0.85
        text = " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
        ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                      add_generation_prompt=True, enable_thinking=think)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        budget = rng.randint(0, 40)
        prompts.append(list(ids))
        budgets.append(budget)
        thinking.append(think)
        params.append({"max_new_tokens": budget + 80, "thinking_budget": budget,
                       "temperature": rng.uniform(0.6, 1.5), "top_p": rng.uniform(0.8, 1.0),
                       "top_k": rng.choice([-1, 50]), "seed": i,
                       "json_schema": json.dumps(SCHEMA)})
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    over, invalid, thought = [], [], 0
    for ids, out, budget, think in zip(prompts, outs, budgets, thinking, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out["meta_info"]
        n = _reasoning_tokens(out["output_ids"], end_id) if think else 0
        thought += n > 0
        if n > budget:
            over.append((budget, n))
        start = output_start(fmt, tok.decode(ids[-16:], skip_special_tokens=False))
        assert start == (REASONING if think else ANSWER)
        reasoning, answer = ReasoningParser(fmt, start).parse(out["text"])
        assert (reasoning is not None) is think
        if think:
            assert reasoning == tok.decode(out["output_ids"][:n])
        try:
            jsonschema.validate(json.loads(answer), SCHEMA)
        except (ValueError, jsonschema.ValidationError) as exc:
            invalid.append((answer, str(exc)[:80]))
    assert over == [] and invalid == []
    assert thought > 100  # most requests did think (random weights: until the budget)


def _chat(client, budget: int, seed: int, extra: dict | None = None, **kw):
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "How far, and how sure?"}],
        response_format=RESPONSE_FORMAT, max_tokens=budget + 80, temperature=1.0, seed=seed,
        extra_body={"thinking_budget": budget, **(extra or {})}, **kw)


@pytest.mark.parametrize("budget", [0, 3, 17])
def test_openai_client_reasoning_content_within_budget_and_valid_content(client, engine,
                                                                         budget):
    out = _chat(client, budget, seed=budget, logprobs=True)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    tokens = [t.token for t in out.choices[0].logprobs.content]
    end = tokens.index("</think>")
    assert end <= budget
    assert msg.reasoning_content == "".join(tokens[:end])
    assert "</think>" not in msg.content and "<think>" not in msg.reasoning_content
    # OpenAI's usage field counts the thinking tokens: those before the closing tag
    assert out.usage.completion_tokens_details.reasoning_tokens == end
    assert out.usage.completion_tokens == len(tokens)  # every token has its logprob


def test_streamed_deltas_join_to_the_same_split(client, engine):
    # the same seed gives the same tokens on the same compute path: each request starts
    # from an empty prefix cache (a cached prefix changes the float sums, and near-ties)
    assert engine.flush_cache()
    whole = _chat(client, 12, seed=7).choices[0].message
    reasoning, content, order = "", "", []
    assert engine.flush_cache()
    for chunk in _chat(client, 12, seed=7, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        r = getattr(delta, "reasoning_content", None)
        if r:
            reasoning += r
            order.append("r")
        if delta.content:
            content += delta.content
            order.append("c")
    assert (reasoning, content) == (whole.reasoning_content, whole.content)
    assert engine.flush_cache()
    usage = [c.usage for c in _chat(client, 12, seed=7, stream=True,
                                    stream_options={"include_usage": True}) if c.usage]
    assert len(usage) == 1 and usage[0].completion_tokens_details.reasoning_tokens == (
        _chat(client, 12, seed=7).usage.completion_tokens_details.reasoning_tokens)
    assert order.index("c") > max(i for i, k in enumerate(order) if k == "r")
    assert order.count("r") > 1  # streamed as it came
    # stream_reasoning false: all of it in one delta once the block has ended
    assert engine.flush_cache()
    pieces = [c.choices[0].delta.model_extra.get("reasoning_content")
              for c in _chat(client, 12, seed=7, stream=True,
                             extra={"stream_reasoning": False})
              if c.choices]
    assert [p for p in pieces if p] == [whole.reasoning_content]


def test_thinking_off_by_chat_template_kwargs(client):
    out = _chat(client, 10, seed=3, extra={"chat_template_kwargs": {"enable_thinking": False}})
    msg = out.choices[0].message
    assert msg.reasoning_content is None  # the template closed the block: no thinking
    jsonschema.validate(json.loads(msg.content), SCHEMA)


def test_separate_reasoning_false_keeps_the_raw_text(client):
    out = _chat(client, 5, seed=1, extra={"separate_reasoning": False})
    msg = out.choices[0].message
    assert getattr(msg, "reasoning_content", None) is None
    reasoning, answer = msg.content.split("</think>")
    jsonschema.validate(json.loads(answer), SCHEMA)


def test_vllm_spelling_and_bad_budgets_are_named(client, server):
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], response_format=RESPONSE_FORMAT,
        max_tokens=84, extra_body={"thinking_token_budget": 4}, logprobs=True)
    tokens = [t.token for t in out.choices[0].logprobs.content]
    assert tokens.index("</think>") <= 4
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    bad = [({"thinking_budget": 4, "thinking_token_budget": 5}, "thinking_token_budget"),
           ({"thinking_budget": -1}, "thinking_budget"),
           ({"thinking_budget": 200}, "thinking_budget=200 is above max_new_tokens=84")]
    for extra, needle in bad:
        with pytest.raises(openai.BadRequestError, match=needle):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], max_tokens=84,
                extra_body=extra)
    r = httpx.post(server.base_url + "/generate", json={
        "text": "x", "sampling_params": {"thinking_budget": 9, "max_new_tokens": 4}})
    assert r.status_code == 400 and "thinking_budget" in r.text


def test_budget_without_a_reasoning_parser_is_a_400(model_path):
    with Engine(model_path, dtype="float32", weight_quant="none", max_total_tokens=2048,
                log_level="warning") as plain:
        with pytest.raises(ValueError, match="thinking_budget needs a reasoning parser"):
            plain.generate("x", {"thinking_budget": 2, "max_new_tokens": 8})
        with ThreadServer(create_app(plain)) as srv:
            c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="u", max_retries=0)
            with pytest.raises(openai.BadRequestError, match="thinking_budget needs a "
                                                             "reasoning parser"):
                c.chat.completions.create(model="m", messages=[{"role": "user",
                                                                "content": "x"}],
                                          max_tokens=8, extra_body={"thinking_budget": 2})


def test_unknown_reasoning_parser_fails_at_startup(model_path):
    with pytest.raises(ValueError, match="unknown reasoning parser 'qwen4'; choose one of .*"
                                         "deepseek-r1.*qwen3, qwen3-thinking"):
        Engine(model_path, reasoning_parser="qwen4")
    with pytest.raises(ValueError, match="enable_strict_thinking needs a reasoning_parser"):
        Engine(model_path, enable_strict_thinking=True)


def test_generate_in_sglang_shape_and_separate_reasoning_route(server, engine):
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    body = {"text": prompt, "sampling_params": {
        "max_new_tokens": 60, "thinking_budget": 6, "temperature": 1.0, "seed": 5,
        "json_schema": json.dumps(SCHEMA)}}
    def post(payload):  # from an empty prefix cache each time: the same seed, the same tokens
        assert engine.flush_cache()
        return httpx.post(server.base_url + "/generate", json=payload)

    split = post(body).json()
    raw = post({**body, "separate_reasoning": False}).json()
    assert raw["output_ids"] == split["output_ids"]
    assert raw["text"] == split["reasoning_text"] + "</think>" + split["text"]
    jsonschema.validate(json.loads(split["text"]), SCHEMA)
    # streamed: cumulative answer and reasoning, ending where the one-shot split does
    assert engine.flush_cache()
    with httpx.stream("POST", server.base_url + "/generate",
                      json={**body, "stream": True}) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith("data:") and line != "data: [DONE]"]
    assert (chunks[-1]["text"], chunks[-1]["reasoning_text"]) == (
        split["text"], split["reasoning_text"])
    assert all(a["reasoning_text"] == b["reasoning_text"][:len(a["reasoning_text"])]
               for a, b in zip(chunks, chunks[1:]))
    # SGLang's /separate_reasoning on that raw text (a forced format: it starts thinking)
    sep = httpx.post(server.base_url + "/separate_reasoning",
                     json={"text": raw["text"], "reasoning_parser": "qwen3-thinking"}).json()
    assert sep == {"text": split["text"], "reasoning_text": split["reasoning_text"]}
    bad = httpx.post(server.base_url + "/separate_reasoning",
                     json={"text": "x", "reasoning_parser": "nope"})
    assert bad.status_code == 400 and "qwen3-thinking" in bad.text
    info = httpx.get(server.base_url + "/get_model_info").json()
    assert info["reasoning_parser"] == "qwen3"


@sgl.function
def _think_then_answer(s):
    s += sgl.user("How far?")
    s += sgl.assistant_begin()
    s += "<think>\n"  # what the template's generation prompt writes (a DSL role does not)
    s += sgl.separate_reasoning(
        sgl.gen("reply", max_tokens=80, json_schema=SCHEMA, thinking_budget=8,
                temperature=1.0, return_logprob=True, return_text_in_logprobs=True),
        model_type="qwen3-thinking")
    s += sgl.assistant_end()


@pytest.mark.parametrize("backend_kind", ["engine", "http"])
def test_dsl_separate_reasoning_with_a_budget(engine, server, backend_kind):
    from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint
    from radixlm.lang.backend.runtime_engine import Runtime

    backend = Runtime(engine) if backend_kind == "engine" else RuntimeEndpoint(server.base_url)
    state = _think_then_answer.run(backend=backend)
    assert state.error() is None
    reply = state["reply"]
    jsonschema.validate(json.loads(reply), SCHEMA)
    tokens = [e[2] for e in state.get_meta_info("reply")["output_token_logprobs"]]
    end = tokens.index("</think>")
    assert end <= 8
    assert state["reply_reasoning_content"] == "".join(tokens[:end]).strip()
    assert state.text().endswith("<think>\n" + reply + "<|im_end|>\n")


def test_tool_call_grammar_applies_after_the_thinking_and_parses_from_the_answer(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}},
            "required": ["city"]}}}]
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=tools,
        tool_choice="required", max_tokens=90, temperature=1.0, seed=4,
        extra_body={"thinking_budget": 9})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Oslo", "Lima")
    assert choice.message.reasoning_content is not None  # split off first


def test_strict_thinking_keeps_the_turn_open_and_the_answer_non_empty(model_path):
    with Engine(model_path, reasoning_parser="qwen3", enable_strict_thinking=True,
                dtype="float32", weight_quant="none", max_total_tokens=8192,
                log_level="warning") as strict:
        tok = strict.tokenizer
        _, end_id = _think_ids(tok)
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True,
                                      add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        # <|im_end|> pushed up hard: only the strict mask keeps it out of the block and off
        # the answer's first token
        outs = strict.generate(input_ids=[list(ids)] * 8, sampling_params=[
            {"max_new_tokens": 40, "thinking_budget": 6, "temperature": 1.0, "seed": s,
             "logit_bias": {str(eos): 8.0}} for s in range(8)])
        for out in outs:
            out_ids = out["output_ids"]
            at = out_ids.index(end_id)
            assert at <= 6 and eos not in out_ids[:at]
            assert len(out_ids) > at + 1 and out_ids[at + 1] != eos
    with Engine(model_path, reasoning_parser="qwen3", dtype="float32", weight_quant="none",
                max_total_tokens=8192, log_level="warning") as loose:
        outs = loose.generate(input_ids=[list(ids)] * 8, sampling_params=[
            {"max_new_tokens": 40, "thinking_budget": 6, "temperature": 1.0, "seed": s,
             "logit_bias": {str(eos): 8.0}} for s in range(8)])
        assert any(end_id not in o["output_ids"] for o in outs)  # ended inside the block


def test_jump_forward_retokenization_keeps_the_streamed_text_a_prefix(tokenizer):
    """A jump-forward that retokenizes the last tokens ("f" + forced "alse" -> "false") must
    not leave the stale "f" in the incremental text (it did before: the stream read
    '{"sure": f, ...' while the final text had 'false')."""
    from radixlm.runtime.detokenizer import IncrementalDetokenizer

    short = tokenizer.encode('{"sure": f', add_special_tokens=False)
    full = tokenizer.encode('{"sure": false, "x"', add_special_tokens=False)
    assert full[:len(short) - 1] == short[:-1] and full[len(short) - 1] != short[-1]
    d = IncrementalDetokenizer(tokenizer)
    for n in range(1, len(short) + 1):
        d.update(short[:n])
    seen = d.text
    for n in range(len(short), len(full) + 1):  # the plan replaced the last token, then more
        d.update(full[:n])
        assert d.text.startswith(seen)
        seen = d.text
    assert d.text == '{"sure": false, "x"'


def test_cli_flags_reach_the_engine_config():
    from radixlm.cli import build_parser, engine_kwargs_from_args
    from radixlm.runtime.config import EngineConfig

    args = build_parser().parse_args(["serve", "--reasoning-parser", "deepseek-r1",
                                      "--enable-strict-thinking"])
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    assert (config.reasoning_parser, config.enable_strict_thinking) == ("deepseek-r1", True)
    args = build_parser().parse_args(["serve", "--reasoning-parser", "r2"])
    with pytest.raises(ValueError, match="unknown reasoning parser 'r2'; choose one of"):
        EngineConfig.from_kwargs(**engine_kwargs_from_args(args))


@pytest.mark.parametrize("constraint, language", [
    ({"regex": r"(yes|no) [0-9]{2}"}, r"(yes|no) [0-9]{2}"),
    ({"ebnf": 'root ::= "ok" | "x=" [0-9] [0-9]?'}, r"ok|x=[0-9]{1,2}"),
])
def test_regex_and_ebnf_apply_after_the_thinking(client, constraint, language):
    for seed in range(4):
        out = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Answer."}], max_tokens=40,
            temperature=1.0, seed=seed, extra_body={"thinking_budget": 6, **constraint},
            logprobs=True)
        msg = out.choices[0].message
        assert out.choices[0].finish_reason == "stop"
        assert re.fullmatch(language, msg.content), msg.content
        tokens = [t.token for t in out.choices[0].logprobs.content]
        assert tokens.index("</think>") <= 6


def test_logprobs_cover_every_token_after_jump_forward_rollbacks(engine):
    # this tokenizer often re-tokenizes the text jump-forward forces (a rollback of the
    # last sampled tokens): each output token still has its logprob, in order
    forced = 0
    for seed in range(6):
        out = engine.generate("hello", {"max_new_tokens": 80, "temperature": 1.0, "seed": seed,
                                        "json_schema": json.dumps(SCHEMA)}, return_logprob=True)
        meta = out["meta_info"]
        forced += meta.get("forced_tokens", 0)
        assert [t for _, t, *_ in meta["output_token_logprobs"]] == out["output_ids"]
    assert forced > 0
