"""The intake: an OpenAI-shaped chat request (`ChatCompletionRequest`) turned into the
engine's calls, and the engine's results read back as chat output. Every chat-shaped front
door (Chat Completions, Responses, ...) translates its own wire format into a
`ChatCompletionRequest` and calls `admit_chat`, then reads results with `chat_output` or
streams them with `chat_deltas`, so each request rule is written once, here or below.

- `admit_chat(state, body, request_id)`: tool fields checked (`tool_calls.py`), the chat
  template applied with tools off the event loop, sampling params and constraints from the
  body (`openai_sampling`), one `GenCall` per sample (`fan_out`), no max tokens meaning the
  rest of the context, then `generation.admit` (validation, the context check, one queue
  place per call or a 429). Returns a `ChatIntake`.
- `chat_output(...)`: a finished call's text split into reasoning, content and tool calls
  with its finish reason; `chat_deltas(...)`: the same as deltas of a stream.
- `usage(...)`, `reasoning_counts(...)`: token counts in OpenAI's chat usage shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from radixlm.constraints.specs import check_depth
from radixlm.formats.tool_parsers import ToolCallStream, ToolSetup
from radixlm.formats.tool_parsers.setup import strict_schema
from radixlm.runtime.request_rules import fan_out_samples
from radixlm.server.errors import ApiError
from radixlm.server.generation import GenCall, admit, merge_streams
from radixlm.server.protocol import OPENAI_SAMPLING, ChatCompletionRequest
from radixlm.server.reasoning import (
    ReasoningSetup,
    reasoning_setup,
    reasoning_tokens,
    split_stream,
    split_text,
)
from radixlm.server.state import ServerState
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

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


# ------------------------------------------------------------------ body -> engine calls


def openai_sampling(req: Any, max_new_tokens: int | None) -> dict[str, Any]:
    """Engine sampling params for an OpenAI body (`protocol._OpenAIBase`; None values
    dropped): each field of `OPENAI_SAMPLING` under its SamplingParams name, and
    `response_format` as a constraint (a `strict` JSON schema closed as tools' are:
    `additionalProperties: false` where it leaves an object open)."""
    s: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    s.update({field: getattr(req, name) for name, field in OPENAI_SAMPLING.items()})
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        s["json_schema"] = json.dumps({"type": "object"})
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.json_schema
        try:  # (before strict_schema's walk, which recurses)
            check_depth(schema, "response_format.json_schema.schema")
        except ValueError as exc:
            raise ApiError(400, str(exc), param="response_format") from None
        s["json_schema"] = json.dumps(strict_schema(schema) if fmt.json_schema.strict
                                      else schema)
    elif fmt is not None and fmt.type == "structural_tag":
        s["structural_tag"] = json.dumps({"structures": fmt.structures,
                                          "triggers": fmt.triggers})
    return {k: v for k, v in s.items() if v is not None}


def chat_top_logprobs(body: ChatCompletionRequest) -> int | None:
    """Top logprobs per token a chat body asks for (`top_logprobs`, 0 without), None
    without `logprobs`."""
    return (body.top_logprobs or 0) if body.logprobs else None


def fan_out(req: Any, prompts: list[tuple[str | None, list[int] | None]],
            sampling: dict[str, Any], top: int | None, request_id: str,
            prompt_logprobs: bool = False) -> list[GenCall]:
    """One call per prompt and sample of an OpenAI body (its `n`, `rid`, `priority`);
    sample j gets seed + j when a seed is given (`request_rules.fan_out_samples`). The rid
    is `rid` from the body, else ``request_id`` (`-k` appended per choice k when there is
    more than one). ``top``: top logprobs per token (None: no logprobs);
    ``prompt_logprobs``: score the prompt too."""
    base, n = req.rid or request_id, req.n
    calls = []
    for i, (text, ids) in enumerate(prompts):
        for rid, seed in fan_out_samples(base, n, sampling.get("seed"), first=i * n,
                                         count=len(prompts) * n):
            s = dict(sampling)
            if "seed" in s:
                s["seed"] = seed
            calls.append(GenCall(text=text, input_ids=ids, sampling=s, rid=rid,
                                 return_logprob=top is not None, top_logprobs_num=top or 0,
                                 return_text_in_logprobs=top is not None,
                                 logprob_start_len=0 if prompt_logprobs else -1,
                                 priority=req.priority))
    return calls


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
    earlier calls and tool results rendered as `tool_calls.py` describes); ApiError 400
    for messages the rules or the template refuse, or too long to fit in any case."""
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


def tool_setup(state: ServerState, body: ChatCompletionRequest) -> ToolSetup | None:
    """The body's tool fields checked in the server's format (ApiError 400 naming the
    problem, also for active tools combined with another constraint)."""
    try:
        setup = request_tools(state.engine, body.tools, body.tool_choice,
                              body.parallel_tool_calls)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="tools") from exc
    other = body.constraint_fields()
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


@dataclass
class ChatIntake:
    """An admitted chat request: its engine ``calls`` (one per sample), the active
    ``tools`` their output is parsed with (None: plain text), whether that output is
    ``constrained`` to the tool format, and the ``reasoning`` split (None: no parser)."""

    calls: list[GenCall]
    tools: ToolSetup | None
    constrained: bool
    reasoning: ReasoningSetup | None


async def admit_chat(state: ServerState, body: ChatCompletionRequest,
                     request_id: str) -> ChatIntake:
    """Turn ``body`` into admitted engine calls (see the module docstring); ApiError
    400/429/503 as `generation.admit` and the rules above raise them. The caller runs the
    calls (`generation.run_calls`, or `open_streams` + `chat_deltas`)."""
    tools = tool_setup(state, body)
    ids, tool_params, constrained = await state.prep.run(
        lambda: _prepare_chat(state, body, tools))
    top = chat_top_logprobs(body)
    sampling = {**openai_sampling(body, body.max_new_tokens), **tool_params}
    calls = fan_out(body, [(None, ids)], sampling, top, request_id)
    for call in calls:  # no max_tokens: up to the context, as in OpenAI
        call.sampling.setdefault("max_new_tokens", max(state.context_len - len(ids), 0))
    await admit(state, calls)
    return ChatIntake(calls, tools if tools is not None and tools.active else None,
                      constrained,
                      reasoning_setup(state, body.separate_reasoning, body.stream_reasoning))


# ------------------------------------------------------------------ results -> chat output


def finish_of(meta: dict[str, Any]) -> str | None:
    """OpenAI's finish reason of an engine result's meta_info (stop, length, abort), None
    while it runs."""
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return _FINISH.get(kind, kind)


def closing_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """A finished choice's fields for ``complete_within_max_tokens``: whether the budget
    closed the document (``closed_by_budget``) and after how many output tokens
    (``closed_at``); none for other requests."""
    if "closed_by_budget" not in meta or meta.get("finish_reason") is None:
        return {}
    out: dict[str, Any] = {"closed_by_budget": meta["closed_by_budget"]}
    if "closed_at" in meta:
        out["closed_at"] = meta["closed_at"]
    return out


def usage(results: list[dict[str, Any]], n: int,
          reasoning: list[int] | None = None) -> dict[str, Any]:
    """OpenAI chat usage of ``results`` (n samples per prompt; the prompt counts once per
    prompt, not once per sample). ``reasoning``: each result's thinking tokens (with a
    reasoning parser), reported as ``completion_tokens_details.reasoning_tokens``."""
    firsts = [r["meta_info"] for r in results[::n]]
    prompt = sum(int(m.get("prompt_tokens", 0)) for m in firsts)
    completion = sum(int(r["meta_info"].get("completion_tokens", 0)) for r in results)
    cached = sum(int(m.get("cached_tokens", 0) or 0) for m in firsts)
    out = {"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}}
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": sum(reasoning)}
    return out


def reasoning_counts(reasoning: ReasoningSetup | None, state: ServerState,
                     calls: Sequence[GenCall],
                     results: list[dict[str, Any]]) -> list[int] | None:
    """Each result's thinking tokens; None without a reasoning split."""
    if reasoning is None:
        return None
    return [reasoning_tokens(reasoning, state, call, r.get("output_ids") or [])
            for call, r in zip(calls, results, strict=True)]


@dataclass
class ChatOutput:
    """One finished choice: ``reasoning`` (None without a reasoning split), ``content``
    (None when it is only tool calls), OpenAI ``tool_calls`` ([] without), and the finish
    reason (``tool_calls`` when it stopped after calls)."""

    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish: str | None


def chat_output(intake: ChatIntake, state: ServerState, k: int,
                result: dict[str, Any]) -> ChatOutput:
    """Choice ``k``'s finished ``result`` read as chat output."""
    thought, text = split_text(intake.reasoning, state, intake.calls[k], result["text"])
    finish = finish_of(result["meta_info"])
    content: str | None = text
    calls: list[dict[str, Any]] = []
    if intake.tools is not None:
        content, calls = intake.tools.parse(text)
        finish = finish_reason(finish, bool(calls))
    return ChatOutput(thought, content, calls, finish)


@dataclass
class ChatDelta:
    """What one engine chunk of choice ``index`` adds: new ``reasoning`` and ``content``
    text, OpenAI tool-call deltas (`ToolCallStream`), and ``finish`` on the choice's last
    delta. ``chunk`` is the engine's cumulative chunk (meta_info, output_ids)."""

    index: int
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish: str | None
    chunk: dict[str, Any]


async def chat_deltas(state: ServerState, intake: ChatIntake,
                      streams: list[Any]) -> AsyncIterator[ChatDelta]:
    """The opened ``streams`` of ``intake.calls`` as deltas, one per engine chunk (merged
    across choices; aborts and errors as `generation.merge_streams`). Joined, a choice's
    deltas are its `chat_output`."""
    calls = intake.calls
    parsers = [ToolCallStream(intake.tools, intake.constrained)
               if intake.tools is not None else None for _ in calls]
    sent = [0] * len(calls)
    async for k, chunk, thought in split_stream(intake.reasoning, state, calls,
                                                merge_streams(state, calls, streams)):
        finish = finish_of(chunk["meta_info"])
        stream = parsers[k]
        tool_calls: list[dict[str, Any]] = []
        if stream is not None:  # content and calls as the format reads the text so far
            content, tool_calls = stream.feed(chunk["text"], finish is not None)
            finish = finish_reason(finish, stream.called)
        else:
            content = chunk["text"][sent[k]:]
            sent[k] = len(chunk["text"])
        yield ChatDelta(k, thought, content, tool_calls, finish, chunk)
