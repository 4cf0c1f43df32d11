"""OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions.

Differences from api.openai.com: any `model` name is accepted (one model is served);
extras `regex`, `choices`, `json_schema`, `ebnf`, `top_k`, `min_p`, `repetition_penalty`,
`min_tokens`, `ignore_eos`, `stop_token_ids`, `skip_special_tokens`, `no_stop_trim`, `rid`,
`priority` may be sent in the body (the `openai` client's `extra_body`). `max_tokens` larger
than the room left in the context is clamped to it; a prompt that fills the context is a 400.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from radixlm.runtime.tool_parsers import ToolCallStream, ToolSetup
from radixlm.server.errors import ApiError
from radixlm.server.generation import (
    GenCall,
    abandon,
    admit,
    merge_streams,
    open_streams,
    run_calls,
)
from radixlm.server.protocol import (
    OPENAI_CONSTRAINTS,
    OPENAI_SAMPLING,
    ChatCompletionRequest,
    CompletionRequest,
    _OpenAIBase,
)
from radixlm.server.reasoning import (
    ReasoningSetup,
    reasoning_setup,
    reasoning_tokens,
    split_stream,
    split_text,
)
from radixlm.server.state import ServerState, get_state
from radixlm.server.streaming import SSEResponse
from radixlm.server.tool_calls import (
    MessageError,
    finish_reason,
    message_dicts,
    render_messages,
    request_sampling,
    request_tools,
    server_parser,
    template_reads_tools,
)
from radixlm.server.validation import check_text

router = APIRouter(prefix="/v1")

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The one served model."""
    state = get_state(request)
    return {"object": "list", "data": [{
        "id": state.model_id, "object": "model", "created": int(time.time()),
        "owned_by": "radixlm", "root": str(state.engine.model_path),
        "max_model_len": state.context_len}]}


def openai_sampling(req: _OpenAIBase, max_new_tokens: int | None) -> dict[str, Any]:
    """Engine sampling params for an OpenAI request (None values dropped): each field of
    `OPENAI_SAMPLING` under its SamplingParams name, and `response_format` as a constraint."""
    s: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    s.update({field: getattr(req, name) for name, field in OPENAI_SAMPLING.items()})
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        s["json_schema"] = json.dumps({"type": "object"})
    elif fmt is not None and fmt.type == "json_schema":
        s["json_schema"] = json.dumps(fmt.json_schema.json_schema)  # type: ignore[union-attr]
    elif fmt is not None and fmt.type == "structural_tag":
        s["structural_tag"] = json.dumps({"structures": fmt.structures,
                                          "triggers": fmt.triggers})
    return {k: v for k, v in s.items() if v is not None}


def _fan_out(req: _OpenAIBase, prompts: list[tuple[str | None, list[int] | None]],
             sampling: dict[str, Any], top: int | None, request_id: str,
             prompt_logprobs: bool = False) -> list[GenCall]:
    """One call per prompt and sample; sample j gets seed + j when a seed is given. The rid
    is `rid` from the body, else the server's request id (`-k` appended per choice k).
    ``prompt_logprobs``: also score the prompt tokens (completions with echo)."""
    base = req.rid or request_id
    calls = []
    for i, (text, ids) in enumerate(prompts):
        for j in range(req.n):
            s = dict(sampling)
            if j and "seed" in s:
                s["seed"] = int(s["seed"]) + j
            rid = base if len(prompts) * req.n == 1 else f"{base}-{i * req.n + j}"
            calls.append(GenCall(text=text, input_ids=ids, sampling=s, rid=rid,
                                 return_logprob=top is not None, top_logprobs_num=top or 0,
                                 return_text_in_logprobs=top is not None,
                                 logprob_start_len=0 if prompt_logprobs else -1,
                                 priority=req.priority))
    return calls


def _usage(results: list[dict[str, Any]], n: int,
           reasoning: list[int] | None = None) -> dict[str, Any]:
    """OpenAI usage; the prompt counts once per prompt, not once per sample. ``reasoning``:
    each result's thinking tokens (with a reasoning parser), reported as OpenAI's
    ``completion_tokens_details.reasoning_tokens``."""
    firsts = [r["meta_info"] for r in results[::n]]
    prompt = sum(int(m.get("prompt_tokens", 0)) for m in firsts)
    completion = sum(int(r["meta_info"].get("completion_tokens", 0)) for r in results)
    cached = sum(int(m.get("cached_tokens", 0) or 0) for m in firsts)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": sum(reasoning)}
    return usage


def _reasoning_counts(reasoning: ReasoningSetup | None, state: ServerState,
                      calls: list[GenCall], results: list[dict[str, Any]]) -> list[int] | None:
    if reasoning is None:
        return None
    return [reasoning_tokens(reasoning, state, call, r.get("output_ids") or [])
            for call, r in zip(calls, results)]


def _finish(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return _FINISH.get(kind, kind)


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
    calls = _fan_out(body, body.prompts, openai_sampling(body, body.max_tokens), top,
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
        choices.append({"index": k, "text": text, "finish_reason": _finish(r["meta_info"]),
                        "logprobs": None if top is None
                        else completion_logprobs(r["meta_info"], 0, top, 0,
                                                 with_prompt=score_prompt)})
    return JSONResponse({**head, "choices": choices, "usage": _usage(results, body.n)})


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
        finish = _finish(meta)
        lp = None
        if body.logprobs is not None:
            lp = completion_logprobs(meta, sent_lp[k], body.logprobs, sent_text[k])
            sent_lp[k] += len(lp["tokens"])
        sent_text[k] = len(chunk["text"])
        if delta or finish is not None or (lp and lp["tokens"]):
            yield {**head, "choices": [{"index": k, "text": delta, "logprobs": lp,
                                        "finish_reason": finish}]}
        if finish is not None:
            finals[k] = chunk
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[k] for k in sorted(finals)]
        yield {**head, "choices": [], "usage": _usage(results, body.n)}


# ---------------------------------------------------------------- /v1/chat/completions


def _texts(content: Any) -> list[str]:
    """The strings in a rendered message's content (a string or a list of text parts)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict)
                and isinstance(p.get("text"), str)]
    return []


def chat_input_ids(state: ServerState, body: ChatCompletionRequest,
                   tools: ToolSetup | None = None) -> list[int]:
    """Token ids of the conversation under the tokenizer's chat template (with ``tools``,
    earlier calls and tool results rendered as `tool_calls.py` describes)."""
    tok = state.engine.tokenizer
    native = template_reads_tools(tok)
    try:
        messages = render_messages(message_dicts(body.messages),
                                   tools.parser if tools is not None else
                                   server_parser(state.engine), tools, native)
    except MessageError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc
    size = 0
    for m in messages:
        for text in _texts(m.get("content")):
            check_text(text, "messages")
            size += len(text.encode())
    if size > state.max_prompt_bytes:
        raise ApiError(400, f"the messages are {size} bytes; no prompt over "
                            f"{state.max_prompt_bytes} bytes fits the context",
                       param="messages", code="context_length_exceeded")
    kwargs = dict(body.chat_template_kwargs or {})
    if native and tools is not None and tools.active:
        kwargs["tools"] = tools.openai_tools
    try:
        out = tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=not body.continue_final_message,
            continue_final_message=body.continue_final_message, **kwargs)
    except Exception as exc:  # noqa: BLE001 - template errors are the caller's messages
        raise ApiError(400, f"the chat template rejected the messages: {exc}",
                       param="messages") from exc
    ids = out["input_ids"] if hasattr(out, "keys") else out
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(t) for t in ids]


def _tool_setup(state: ServerState, body: ChatCompletionRequest) -> ToolSetup | None:
    try:
        setup = request_tools(state.engine, body.tools, body.tool_choice,
                              body.parallel_tool_calls)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="tools") from exc
    other = [k for k in OPENAI_CONSTRAINTS if getattr(body, k)]
    if body.response_format is not None and body.response_format.type != "text":
        other.append("response_format")
    if setup is not None and setup.active and other:
        raise ApiError(400, f"'tools' (tool_choice {setup.choice!r}) cannot be combined with "
                       f"{', '.join(other)}; use tool_choice 'none' for those", param="tools")
    return setup


def _prepare_chat(state: ServerState, body: ChatCompletionRequest,
                  tools: ToolSetup | None) -> tuple[list[int], dict[str, Any], bool]:
    """(prompt ids, the tools' sampling params, whether the output is constrained to the
    tool format); runs in the prep pool."""
    ids = chat_input_ids(state, body, tools)
    if tools is None or not tools.active:
        return ids, {}, False
    try:
        sampling, constrained = request_sampling(state.engine, tools, body.skip_special_tokens)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="tools") from exc
    return ids, sampling, constrained


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI chat completions (chat template of the served model's tokenizer), with tool
    calling (`tool_calls.py`)."""
    state = get_state(request)
    tools = _tool_setup(state, body)
    ids, tool_params, constrained = await state.prep.run(
        lambda: _prepare_chat(state, body, tools))
    top = (body.top_logprobs or 0) if body.logprobs else None
    sampling = {**openai_sampling(body, body.max_new_tokens), **tool_params}
    calls = _fan_out(body, [(None, ids)], sampling, top, request.state.request_id)
    for call in calls:  # no max_tokens: up to the context, as in OpenAI
        call.sampling.setdefault("max_new_tokens", max(state.context_len - len(ids), 0))
    await admit(state, calls)
    head = {"id": f"chatcmpl-{calls[0].rid}", "created": int(time.time()),
            "model": state.model_id}
    parsing = tools if tools is not None and tools.active else None
    reasoning = reasoning_setup(state, body.separate_reasoning, body.stream_reasoning)
    if body.stream:
        streams = await open_streams(state, calls)
        return SSEResponse(_chat_stream(state, body, calls, streams,
                                        {**head, "object": "chat.completion.chunk"}, parsing,
                                        constrained, reasoning),
                           on_close=lambda: abandon(state, calls),
                           stall_timeout=state.settings.stream_stall_timeout)
    results = await run_calls(state, calls, request)
    choices = []
    for k, r in enumerate(results):
        thought, text = split_text(reasoning, state, calls[k], r["text"])
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = thought
        finish = _finish(r["meta_info"])
        if parsing is not None:
            message["content"], tool_calls = parsing.parse(text)
            if tool_calls:
                message["tool_calls"] = tool_calls
            finish = finish_reason(finish, bool(tool_calls))
        choices.append({"index": k, "message": message, "finish_reason": finish,
                        "logprobs": chat_logprobs(r["meta_info"], 0) if body.logprobs else None})
    return JSONResponse({**head, "object": "chat.completion", "choices": choices,
                         "usage": _usage(results, body.n,
                                         _reasoning_counts(reasoning, state, calls, results))})


def _tool_chunks(stream: ToolCallStream, text: str, final: bool, k: int,
                 head: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(content delta, one chunk per tool-call delta) of choice ``k``'s text so far."""
    content, deltas = stream.feed(text, final)
    return content, [{**head, "choices": [{"index": k, "delta": {"tool_calls": [d]},
                                           "logprobs": None, "finish_reason": None}]}
                     for d in deltas]


async def _chat_stream(state: ServerState, body: ChatCompletionRequest, calls: list[GenCall],
                       streams: list[Any], head: dict[str, Any],
                       tools: ToolSetup | None = None,
                       constrained: bool = False,
                       reasoning: ReasoningSetup | None = None) -> AsyncIterator[dict[str, Any]]:
    for k in range(len(calls)):
        yield {**head, "choices": [{"index": k, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}
    sent_text = [0] * len(calls)
    sent_lp = [0] * len(calls)
    finals: dict[int, dict[str, Any]] = {}
    parsers = [ToolCallStream(tools, constrained) if tools is not None else None
               for _ in calls]
    async for k, chunk, thought in split_stream(reasoning, state, calls,
                                                merge_streams(state, calls, streams)):
        if thought:  # the thinking streams as its own deltas; chunk["text"] is the answer
            yield {**head, "choices": [{"index": k, "delta": {"reasoning_content": thought},
                                        "logprobs": None, "finish_reason": None}]}
        meta = chunk["meta_info"]
        finish = _finish(meta)
        tool_chunks: list[dict[str, Any]] = []
        stream = parsers[k]
        if stream is not None:  # content and calls as the format reads the text so far
            delta, tool_chunks = _tool_chunks(stream, chunk["text"], finish is not None, k,
                                              head)
            finish = finish_reason(finish, stream.called)
        else:
            delta = chunk["text"][sent_text[k]:]
            sent_text[k] = len(chunk["text"])
        lp = None
        if body.logprobs:
            lp = chat_logprobs(meta, sent_lp[k])
            sent_lp[k] += len(lp["content"])
        last = finish if not tool_chunks else None  # the finish goes after the calls
        if delta or last is not None or (lp and lp["content"]):
            yield {**head, "choices": [{"index": k, "delta": {"content": delta} if delta else {},
                                        "logprobs": lp, "finish_reason": last}]}
        for c in tool_chunks:
            yield c
        if finish is not None:
            if tool_chunks:
                yield {**head, "choices": [{"index": k, "delta": {}, "logprobs": None,
                                            "finish_reason": finish}]}
            finals[k] = chunk
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[k] for k in sorted(finals)]
        yield {**head, "choices": [], "usage": _usage(
            results, body.n, _reasoning_counts(reasoning, state, calls, results))}
