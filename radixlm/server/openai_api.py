"""OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions.

Differences from api.openai.com: any `model` name is accepted (one model is served);
extras `regex`, `choices`, `json_schema`, `ebnf`, `top_k`, `min_p`, `repetition_penalty`,
`min_tokens`, `ignore_eos`, `stop_token_ids`, `skip_special_tokens`, `no_stop_trim`, `rid`,
`priority` may be sent in the body (the `openai` client's `extra_body`). `max_tokens` larger
than the room left in the context is clamped to it; a prompt that fills the context is a 400.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from radixlm.server.generation import (
    GenCall,
    abandon,
    admit,
    merge_streams,
    open_streams,
    run_calls,
)
from radixlm.server.intake import (
    ChatIntake,
    admit_chat,
    chat_deltas,
    chat_output,
    closing_fields,
    fan_out,
    finish_of,
    openai_sampling,
    reasoning_counts,
    usage,
)
from radixlm.server.protocol import ChatCompletionRequest, CompletionRequest
from radixlm.server.state import ServerState, get_state
from radixlm.server.streaming import SSEResponse

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The one served model."""
    state = get_state(request)
    return {"object": "list", "data": [{
        "id": state.model_id, "object": "model", "created": int(time.time()),
        "owned_by": "radixlm", "root": str(state.engine.model_path),
        "max_model_len": state.context_len}]}


def _token_str(entry: Any) -> str:
    text = entry[2] if len(entry) > 2 else None
    return text if text is not None else ""


def completion_logprobs(meta: dict[str, Any], start: int, top: int, offset0: int,
                        with_prompt: bool = False) -> dict[str, Any]:
    """Legacy completions logprobs for output tokens [start:], text offsets from offset0;
    ``with_prompt`` (echo): the prompt's tokens first, the very first one with logprob
    None (nothing precedes it)."""
    entries = (meta.get("output_token_logprobs") or [])[start:]
    tops = (meta.get("output_top_logprobs") or [])[start:]
    if with_prompt:
        entries = (meta.get("input_token_logprobs") or []) + entries
        tops = (meta.get("input_top_logprobs") or []) + tops
    tokens = [_token_str(e) for e in entries]
    offsets, pos = [], offset0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top_lists = None
    if top > 0:
        top_lists = [None if row is None else {_token_str(e): e[0] for e in row}
                     for row in tops]  # None: the first prompt token (nothing before it)
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries],
            "top_logprobs": top_lists, "text_offset": offsets}


def chat_logprobs(meta: dict[str, Any], start: int) -> dict[str, Any]:
    """Chat logprobs ({"content": [...]}) for output tokens [start:]."""
    entries = (meta.get("output_token_logprobs") or [])[start:]
    tops = (meta.get("output_top_logprobs") or [])[start:]
    content = []
    for k, e in enumerate(entries):
        row = tops[k] if k < len(tops) and tops[k] else []
        content.append({"token": _token_str(e), "logprob": e[0],
                        "bytes": list(_token_str(e).encode()),
                        "top_logprobs": [{"token": _token_str(t), "logprob": t[0],
                                          "bytes": list(_token_str(t).encode())}
                                         for t in row]})
    return {"content": content}


# ---------------------------------------------------------------- /v1/completions


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI text completions (batch prompts and n fanned out, prompt-major indices)."""
    state = get_state(request)
    top = body.logprobs
    score_prompt = body.echo and top is not None  # echo + logprobs: the prompt's too
    calls = fan_out(body, body.prompts, openai_sampling(body, body.max_tokens), top,
                     request.state.request_id, prompt_logprobs=score_prompt)
    await admit(state, calls)
    cid, created = f"cmpl-{calls[0].rid}", int(time.time())
    head = {"id": cid, "object": "text_completion", "created": created, "model": state.model_id}
    if body.stream:
        streams = await open_streams(state, calls)
        return SSEResponse(_completion_stream(state, body, calls, streams, head),
                           on_close=lambda: abandon(state, calls),
                           stall_timeout=state.settings.stream_stall_timeout)
    results = await run_calls(state, calls, request)
    choices = []
    for k, (call, r) in enumerate(zip(calls, results, strict=True)):
        text = r["text"]
        if body.echo:
            text = (call.text if call.text is not None
                    else state.engine.tokenizer.decode(call.input_ids)) + text
        choices.append({"index": k, "text": text, "finish_reason": finish_of(r["meta_info"]),
                        "logprobs": None if top is None
                        else completion_logprobs(r["meta_info"], 0, top, 0,
                                                 with_prompt=score_prompt),
                        **closing_fields(r["meta_info"])})
    return JSONResponse({**head, "choices": choices, "usage": usage(results, body.n)})


async def _completion_stream(state: ServerState, body: CompletionRequest, calls: list[GenCall],
                             streams: list[Any],
                             head: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    sent_text = [0] * len(calls)
    sent_lp = [0] * len(calls)
    finals: dict[int, dict[str, Any]] = {}
    if body.echo:
        for k, call in enumerate(calls):
            echo = (call.text if call.text is not None
                    else state.engine.tokenizer.decode(call.input_ids))
            yield {**head, "choices": [{"index": k, "text": echo, "logprobs": None,
                                        "finish_reason": None}]}
    async for k, chunk in merge_streams(state, calls, streams):
        meta = chunk["meta_info"]
        delta = chunk["text"][sent_text[k]:]
        finish = finish_of(meta)
        lp = None
        if body.logprobs is not None:
            lp = completion_logprobs(meta, sent_lp[k], body.logprobs, sent_text[k])
            sent_lp[k] += len(lp["tokens"])
        sent_text[k] = len(chunk["text"])
        if delta or finish is not None or (lp and lp["tokens"]):
            yield {**head, "choices": [{"index": k, "text": delta, "logprobs": lp,
                                        "finish_reason": finish, **closing_fields(meta)}]}
        if finish is not None:
            finals[k] = chunk
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[k] for k in sorted(finals)]
        yield {**head, "choices": [], "usage": usage(results, body.n)}


# ---------------------------------------------------------------- /v1/chat/completions


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI chat completions (chat template of the served model's tokenizer), with tool
    calling (`tool_calls.py`); the request is the intake's (`intake.py`)."""
    state = get_state(request)
    intake = await admit_chat(state, body, request.state.request_id)
    calls = intake.calls
    head = {"id": f"chatcmpl-{calls[0].rid}", "created": int(time.time()),
            "model": state.model_id}
    if body.stream:
        streams = await open_streams(state, calls)
        return SSEResponse(_chat_stream(state, body, intake, streams,
                                        {**head, "object": "chat.completion.chunk"}),
                           on_close=lambda: abandon(state, calls),
                           stall_timeout=state.settings.stream_stall_timeout)
    results = await run_calls(state, calls, request)
    choices = []
    for k, r in enumerate(results):
        out = chat_output(intake, state, k, r)
        message: dict[str, Any] = {"role": "assistant", "content": out.content}
        if intake.reasoning is not None:
            message["reasoning_content"] = out.reasoning
        if out.tool_calls:
            message["tool_calls"] = out.tool_calls
        choices.append({"index": k, "message": message, "finish_reason": out.finish,
                        "logprobs": chat_logprobs(r["meta_info"], 0) if body.logprobs else None,
                        **closing_fields(r["meta_info"])})
    return JSONResponse({**head, "object": "chat.completion", "choices": choices,
                         "usage": usage(results, body.n, reasoning_counts(
                             intake.reasoning, state, calls, results))})


async def _chat_stream(state: ServerState, body: ChatCompletionRequest, intake: ChatIntake,
                       streams: list[Any],
                       head: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    calls = intake.calls
    for k in range(len(calls)):
        yield {**head, "choices": [{"index": k, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}
    sent_lp = [0] * len(calls)
    finals: dict[int, dict[str, Any]] = {}
    async for d in chat_deltas(state, intake, streams):
        k = d.index
        if d.reasoning:  # the thinking streams as its own deltas
            yield {**head, "choices": [{"index": k, "delta": {"reasoning_content": d.reasoning},
                                        "logprobs": None, "finish_reason": None}]}
        lp = None
        if body.logprobs:
            lp = chat_logprobs(d.chunk["meta_info"], sent_lp[k])
            sent_lp[k] += len(lp["content"])
        last = d.finish if not d.tool_calls else None  # the finish goes after the calls
        closing = closing_fields(d.chunk["meta_info"])
        if d.content or last is not None or (lp and lp["content"]):
            yield {**head, "choices": [{"index": k, "delta": {"content": d.content}
                                        if d.content else {},
                                        "logprobs": lp, "finish_reason": last,
                                        **(closing if last is not None else {})}]}
        for call in d.tool_calls:
            yield {**head, "choices": [{"index": k, "delta": {"tool_calls": [call]},
                                        "logprobs": None, "finish_reason": None}]}
        if d.finish is not None:
            if d.tool_calls:
                yield {**head, "choices": [{"index": k, "delta": {}, "logprobs": None,
                                            "finish_reason": d.finish, **closing}]}
            finals[k] = d.chunk
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[k] for k in sorted(finals)]
        yield {**head, "choices": [], "usage": usage(
            results, body.n, reasoning_counts(intake.reasoning, state, calls, results))}
