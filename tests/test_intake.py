"""The request rules every route shares (`runtime/request_rules.py`) and the intake's use of
them, on plain request bodies and a fake server state: no engine, no model, no torch.

Covers the `n` fan-out (sample j: seed + j, rid `rid-j`) of the OpenAI intake and the native
/generate, the max_new_tokens clamp against the context and its error texts, and the bounds
of a request (n, top logprobs, logit_bias, one constraint)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from radixlm.runtime.request_rules import (
    PromptFillsContext,
    fan_out_samples,
    fit_max_new_tokens,
    sample_rid,
    sample_seed,
)
from radixlm.runtime.sampling_params import MAX_N, MAX_TOP_LOGPROBS
from radixlm.server.errors import ApiError
from radixlm.server.generation import GenCall, admit
from radixlm.server.intake import chat_top_logprobs, fan_out, openai_sampling
from radixlm.server.native import build_native_calls
from radixlm.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from radixlm.server.validation import PrepPool, parse_call_params

CHAT = [{"role": "user", "content": "hi"}]

# ------------------------------------------------------------------ the rules themselves


def test_the_rules_module_loads_no_torch_nor_the_package():
    code = ("import sys; import radixlm.runtime.request_rules; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('radixlm.lang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr


def test_sample_seed_and_rid():
    assert [sample_seed(7, j) for j in range(3)] == [7, 8, 9]
    assert sample_seed(None, 2) is None
    assert sample_rid("r", 0, 1) == "r"
    assert [sample_rid("r", k, 3) for k in range(3)] == ["r-0", "r-1", "r-2"]


def test_fan_out_samples():
    assert fan_out_samples("r", 1, 5) == [("r", 5)]
    assert fan_out_samples("r", 3, 5) == [("r-0", 5), ("r-1", 6), ("r-2", 7)]
    assert fan_out_samples("r", 2, None) == [("r-0", None), ("r-1", None)]
    # the second prompt of two, two samples each: choices 2 and 3 of one rid
    assert fan_out_samples("r", 2, 5, first=2, count=4) == [("r-2", 5), ("r-3", 6)]
    # one sample of one prompt among two: numbered all the same
    assert fan_out_samples("r", 1, None, first=1, count=2) == [("r-1", None)]


def test_fit_max_new_tokens_clamps_to_the_room():
    assert fit_max_new_tokens(3, 5, 10) == 5
    assert fit_max_new_tokens(3, 7, 10) == 7
    assert fit_max_new_tokens(3, 8, 10) == 7
    assert fit_max_new_tokens(9, 100, 10) == 1
    assert fit_max_new_tokens(3, 7, 10, strict=True) == 7


def test_fit_max_new_tokens_errors():
    with pytest.raises(ValueError) as exc:
        fit_max_new_tokens(3, 8, 10, strict=True)
    assert str(exc.value) == ("max_new_tokens=8 goes beyond the context: prompt 3 + "
                              "max_new_tokens > 10")
    for prompt_len in (10, 11):
        with pytest.raises(PromptFillsContext) as full:
            fit_max_new_tokens(prompt_len, 1, 10)
        assert isinstance(full.value, ValueError)
        assert str(full.value) == f"prompt has {prompt_len} tokens; the context is 10"
        assert (full.value.prompt_len, full.value.context_len) == (prompt_len, 10)


# ------------------------------------------------------------------ OpenAI bodies fanned out


def _completion(**body) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "hi", **body})


def test_openai_fan_out_seeds_and_rids():
    body = _completion(prompt=["a", "b"], n=2, seed=5, max_tokens=3)
    calls = fan_out(body, body.prompts, openai_sampling(body, body.max_tokens), None, "req")
    assert [c.rid for c in calls] == ["req-0", "req-1", "req-2", "req-3"]
    assert [c.sampling["seed"] for c in calls] == [5, 6, 5, 6]
    assert [c.text for c in calls] == ["a", "a", "b", "b"]
    assert all(c.sampling["max_new_tokens"] == 3 for c in calls)
    assert all(not c.return_logprob and c.top_logprobs_num == 0 for c in calls)


def test_openai_fan_out_one_choice_and_the_body_rid():
    body = _completion(rid="mine")
    [call] = fan_out(body, body.prompts, openai_sampling(body, None), 2, "req")
    assert call.rid == "mine" and "seed" not in call.sampling
    assert (call.return_logprob, call.top_logprobs_num, call.logprob_start_len) == (True, 2, -1)
    body = _completion(n=3, priority=4)
    calls = fan_out(body, body.prompts, openai_sampling(body, None), None, "req",
                    prompt_logprobs=True)
    assert [c.rid for c in calls] == ["req-0", "req-1", "req-2"]
    assert all("seed" not in c.sampling and c.priority == 4 and c.logprob_start_len == 0
               for c in calls)


def test_chat_top_logprobs():
    chat = ChatCompletionRequest.model_validate
    assert chat_top_logprobs(chat({"messages": CHAT})) is None
    assert chat_top_logprobs(chat({"messages": CHAT, "logprobs": True})) == 0
    assert chat_top_logprobs(chat({"messages": CHAT, "logprobs": True,
                                   "top_logprobs": 3})) == 3


# ------------------------------------------------------------------ native /generate


def test_native_fan_out_seeds_and_rids():
    body = GenerateRequest.model_validate({
        "text": ["x", "y"], "rid": ["a", "b"],
        "sampling_params": [{"max_new_tokens": 2, "n": 2, "seed": 7},
                            {"max_new_tokens": 2, "sampling_seed": 3}]})
    calls = build_native_calls(body, "req")
    assert [c.rid for c in calls] == ["a-0", "a-1", "b"]
    assert [c.sampling.get("seed") for c in calls] == [7, 8, 3]
    assert all("n" not in c.sampling and "sampling_seed" not in c.sampling for c in calls)


def test_native_fan_out_without_rid_or_seed():
    body = GenerateRequest.model_validate({"text": "x", "sampling_params": {"n": 2}})
    calls = build_native_calls(body, "req")
    assert [c.rid for c in calls] == ["req-0", "req-1"]
    assert all("seed" not in c.sampling for c in calls)
    body = GenerateRequest.model_validate({"text": ["x", "y"], "rid": "p"})
    assert [c.rid for c in build_native_calls(body, "req")] == ["p-0", "p-1"]
    body = GenerateRequest.model_validate({"text": ["x", "y"]})
    assert [c.rid for c in build_native_calls(body, "req")] == ["req-0", "req-1"]


# ------------------------------------------------------------------ the clamp at admission


class _CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _admit(calls: list[GenCall], context_len: int = 10) -> None:
    pool = PrepPool(1, 4)
    state = SimpleNamespace(shutting_down=False, engine_alive=True, prep=pool,
                            engine=SimpleNamespace(tokenizer=_CharTokenizer()),
                            max_prompt_bytes=1000, context_len=context_len)
    try:
        asyncio.run(admit(state, calls))
    finally:
        pool.shutdown()


def test_admit_clamps_max_new_tokens_to_the_room():
    calls = [GenCall(text="abc", input_ids=None, sampling={"max_new_tokens": 50}),
             GenCall(text=None, input_ids=[1, 2], sampling={"max_new_tokens": 4}),
             GenCall(text="abcd", input_ids=None, sampling={})]  # the default, 128
    _admit(calls)
    assert [c.prompt_len for c in calls] == [3, 2, 4]
    assert [c.params.max_new_tokens for c in calls] == [7, 4, 6]


def test_admit_refuses_a_prompt_that_fills_the_context():
    with pytest.raises(ApiError) as exc:
        _admit([GenCall(text="x" * 10, input_ids=None, sampling={"max_new_tokens": 1})])
    assert exc.value.status == 400 and exc.value.code == "context_length_exceeded"
    assert exc.value.message == ("the prompt has 10 tokens but the context length is 10 "
                                 "(prompt + at least one new token must fit)")
    assert exc.value.param == "prompt"


def test_admit_embedding_may_fill_the_context():
    call = GenCall(text="x" * 10, input_ids=None, sampling={}, encode=True)
    _admit([call])
    assert call.prompt_len == 10
    with pytest.raises(ApiError, match="the input has 11 tokens but the context length is 10"):
        _admit([GenCall(text="x" * 11, input_ids=None, sampling={}, encode=True)])


# ------------------------------------------------------------------ bounds


@pytest.mark.parametrize("n", [0, MAX_N + 1])
def test_n_bounds(n):
    with pytest.raises(ValidationError, match="n"):
        _completion(n=n)
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": CHAT, "n": n})
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate({"text": "x", "sampling_params": {"n": n}})


def test_n_at_the_bound_is_accepted():
    body = _completion(n=MAX_N)
    assert len(fan_out(body, body.prompts, openai_sampling(body, None), None, "r")) == MAX_N


def test_top_logprobs_bounds():
    too_many = MAX_TOP_LOGPROBS + 1
    with pytest.raises(ValidationError):
        _completion(logprobs=too_many)
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": CHAT, "logprobs": True,
                                              "top_logprobs": too_many})
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate({"text": "x", "top_logprobs_num": too_many})
    with pytest.raises(ValidationError, match="'top_logprobs' requires 'logprobs'"):
        ChatCompletionRequest.model_validate({"messages": CHAT, "top_logprobs": 2})
    with pytest.raises(ApiError, match=f"top_logprobs_num must be <= {MAX_TOP_LOGPROBS}, "
                                       f"got {too_many}"):
        parse_call_params({}, too_many)
    assert parse_call_params({}, MAX_TOP_LOGPROBS).max_new_tokens == 128


def test_logit_bias_bounds():
    assert _completion(logit_bias={" 7": 1.5}).logit_bias == {"7": 1.5}
    with pytest.raises(ValidationError, match="logit_bias key 'x' is not a token id"):
        _completion(logit_bias={"x": 1.0})
    with pytest.raises(ApiError, match="logit_bias key '-1' is not a token id"):
        parse_call_params({"logit_bias": {"-1": 1.0}}, 0)


def test_one_constraint():
    with pytest.raises(ValidationError, match="at most one constraint may be given, got "
                                              "regex, choices"):
        _completion(regex="a+", choices=["a"])
    with pytest.raises(ValidationError, match="at most one constraint may be given, got "
                                              "regex, response_format"):
        ChatCompletionRequest.model_validate({"messages": CHAT, "regex": "a",
                                              "response_format": {"type": "json_object"}})
    chat = ChatCompletionRequest.model_validate(
        {"messages": CHAT, "response_format": {"type": "json_object"}})
    assert chat.constraint_fields() == ["response_format"]
    text = ChatCompletionRequest.model_validate(
        {"messages": CHAT, "response_format": {"type": "text"}})
    assert text.constraint_fields() == []
    assert _completion(ebnf="root ::= 'a'").constraint_fields() == ["ebnf"]
    with pytest.raises(ApiError, match="at most one constraint per request, got regex, "
                                       "choices"):
        parse_call_params({"regex": "a", "choices": ["a"]}, 0)


def test_a_response_format_schema_nested_too_deep_is_a_400():
    """``strict_schema`` walks the schema recursively before the spec is made: the depth is
    checked first, in the API's error shape."""
    schema: dict = {"type": "string"}
    for _ in range(70):  # 141 levels of JSON
        schema = {"type": "object", "properties": {"a": schema}}
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                 response_format={"type": "json_schema", "json_schema": {
                                     "name": "deep", "schema": schema, "strict": True}})
    with pytest.raises(ApiError, match="nests deeper than 128 levels") as exc:
        openai_sampling(body, 8)
    assert exc.value.status == 400 and exc.value.param == "response_format"
