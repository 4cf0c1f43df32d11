"""The Responses API's request side: the body (`ResponsesRequest`), its `input` items
checked and kept as stored items (`input_items`), and the conversation turned into the Chat
Completions request it means (`chat_messages`, `chat_request`), whose rules then check it.

Instructions become the system message; a `function_call` joins the assistant turn before
it; a `function_call_output` (whose `call_id` must answer an earlier call) becomes a `tool`
message; a `reasoning` item becomes the next assistant turn's `reasoning_content`. Errors
name the Responses field (`input[3].call_id`), as 400s in OpenAI's shape.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from radixlm.server.errors import ApiError
from radixlm.server.protocol import ChatCompletionRequest

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs"}
# chat field -> the Responses field it came from (in errors raised by the chat rules)
_PARAMS = {"messages": "input", "prompt": "input", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}


def new_id(kind: str) -> str:
    """A new id for an item of ``kind`` (`msg_...`, `fc_...`, `rs_...`)."""
    return f"{_ID_PREFIX.get(kind, kind)}_{uuid.uuid4().hex}"


# ---------------------------------------------------------------- request body


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON matching `schema`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat | None = None


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(BaseModel):
    """Body of POST /v1/responses (the fields this server serves; others are a 400)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    background: bool | None = None
    include: list[str] | None = None
    stream: bool | None = False
    prompt_cache_key: str | None = None  # inert: the radix cache shares prefixes by itself

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and (len(v) > 16 or any(len(k) > 64 or len(x) > 512
                                                 for k, x in v.items())):
            raise ValueError("at most 16 pairs, keys up to 64 and values up to 512 characters")
        return v


def check_supported(body: ResponsesRequest, reasoning_parser: str | None) -> None:
    """400 for the fields this server cannot honour (see the module docstring)."""
    if body.background:
        raise ApiError(400, "'background' responses are not supported by this server",
                       param="background")
    if body.include:
        raise ApiError(400, f"include: {body.include[0]!r} is not supported by this server",
                       param="include")
    if body.truncation not in (None, "disabled"):
        raise ApiError(400, f"truncation: only 'disabled' is supported, got "
                            f"{body.truncation!r}", param="truncation")
    r = body.reasoning
    if r is not None and (r.effort not in (None, "none") or r.summary is not None) \
            and reasoning_parser is None:
        raise ApiError(400, "reasoning: this model has no reasoning parser (start the server "
                            "with --reasoning-parser)", param="reasoning")


# ---------------------------------------------------------------- input items


def bad_request(where: str, message: str) -> ApiError:
    """A 400 naming the field ``where`` (``message`` follows its name)."""
    return ApiError(400, f"{where}{message}", param=where)


def _parts_text(where: str, content: Any, allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    """A content string or list of text parts as [{"type", "text"}] parts."""
    if isinstance(content, str):
        return [{"type": allowed[0], "text": content}]
    if not isinstance(content, list):
        raise bad_request(where, " must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            raise bad_request(f"{at}.type", f": {kind!r} is not supported by this server "
                              f"(it takes {' / '.join(allowed)} parts: text only)")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{at}.text", " is required (a string)")
        parts.append({"type": kind, "text": part["text"]})
    return parts


def _fields(where: str, item: dict[str, Any], allowed: set[str], required: tuple[str, ...]
            ) -> None:
    unknown = sorted(set(item) - allowed - {"type", "id", "status"})
    if unknown:
        raise bad_request(f"{where}.{unknown[0]}",
                          f" is not a field of a {item.get('type')!r} item")
    for name in required:
        if not isinstance(item.get(name), str) or not item[name]:
            raise bad_request(f"{where}.{name}", " is required (a non-empty string)")


def _input_item(where: str, item: Any) -> dict[str, Any]:
    """One `input` entry as a stored item (with an id; text parts only)."""
    if not isinstance(item, dict):
        raise bad_request(where, " must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    out: dict[str, Any] = {"type": kind, "id": item.get("id") or new_id(str(kind))}
    if kind == "message":
        _fields(where, item, {"role", "content", "phase"}, ())
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise bad_request(f"{where}.role",
                              f": {role!r} must be user, system, developer or assistant")
        allowed = ("output_text", "input_text") if role == "assistant" else ("input_text",)
        out.update(role=role, content=_parts_text(f"{where}.content", item.get("content"),
                                                  allowed), status="completed")
    elif kind == "function_call":
        _fields(where, item, {"call_id", "name", "arguments"}, ("call_id", "name", "arguments"))
        try:
            ok = isinstance(json.loads(item["arguments"]), dict)
        except ValueError:
            ok = False
        if not ok:
            raise bad_request(f"{where}.arguments", " must be a JSON string of an object")
        out.update(call_id=item["call_id"], name=item["name"], arguments=item["arguments"],
                   status="completed")
    elif kind == "function_call_output":
        _fields(where, item, {"call_id", "output"}, ("call_id",))
        output = item.get("output")
        text = output if isinstance(output, str) else "".join(
            p["text"] for p in _parts_text(f"{where}.output", output, ("input_text",)))
        out.update(call_id=item["call_id"], output=text, status="completed")
    elif kind == "reasoning":
        _fields(where, item, {"summary", "content", "encrypted_content"}, ())
        if item.get("encrypted_content") is not None:
            raise bad_request(f"{where}.encrypted_content", " is not supported by this server")
        out.update(summary=_parts_text(f"{where}.summary", item.get("summary") or [],
                                       ("summary_text",)),
                   content=_parts_text(f"{where}.content", item.get("content") or [],
                                       ("reasoning_text",)))
    else:
        raise bad_request(f"{where}.type", f": item type {kind!r} is not supported by this "
                          "server (message, function_call, function_call_output, reasoning)")
    return out


def input_items(body_input: str | list[dict[str, Any]],
                history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's `input` as stored items, checked: each `function_call_output` answers
    a `function_call` before it (in ``history``, the earlier conversation, or the input)."""
    if isinstance(body_input, str):
        return [{"type": "message", "id": new_id("message"), "role": "user",
                 "content": [{"type": "input_text", "text": body_input}],
                 "status": "completed"}]
    calls = {i["call_id"] for i in history if i["type"] == "function_call"}
    items = []
    for n, raw in enumerate(body_input):
        item = _input_item(f"input[{n}]", raw)
        if item["type"] == "function_call":
            calls.add(item["call_id"])
        if item["type"] == "function_call_output" and item["call_id"] not in calls:
            raise bad_request(f"input[{n}].call_id",
                              f": {item['call_id']!r} answers no earlier function_call")
        items.append(item)
    return items


def chat_messages(instructions: str | None,
                  items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat messages: instructions as the system message, function
    calls in the assistant turn they follow, their outputs as `tool` messages, reasoning as
    the next assistant turn's `reasoning_content`."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    thought: str | None = None
    prev = None  # the kind of the previous item (a call joins the assistant turn before it)
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            parts = item["content"] or item["summary"]
            thought = (thought or "") + "".join(p["text"] for p in parts)
            continue
        if kind == "message":
            m: dict[str, Any] = {"role": item["role"],
                                 "content": "".join(p["text"] for p in item["content"])}
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and prev in (
                    "message", "function_call") and thought is None:
                last.setdefault("tool_calls", []).append(call)
                prev = kind
                continue
            m = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            m = {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
        if m["role"] == "assistant" and thought is not None:
            m["reasoning_content"], thought = thought, None
        messages.append(m)
        prev = kind
    return messages


# ---------------------------------------------------------------- body -> chat request


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools in the chat shape (strict unless `strict: false`)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise bad_request(f"tools[{i}].type", f": tool type {kind!r} is not supported by "
                              "this server (only 'function' tools)")
        unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
        if unknown:
            raise bad_request(f"tools[{i}].{unknown[0]}", " is not a field of a function tool")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        fn["strict"] = tool.get("strict") is not False
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or set(choice) != {"type", "name"}:
        raise bad_request("tool_choice", f": {choice!r} is not supported by this server "
                          "('none', 'auto', 'required' or {'type': 'function', 'name': ...})")
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    if not fmt.name or fmt.json_schema is None:
        raise bad_request("text.format", ": type 'json_schema' needs 'name' and 'schema'")
    spec = {"name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict,
            "description": fmt.description}
    return {"type": "json_schema",
            "json_schema": {k: v for k, v in spec.items() if v is not None}}


def remap_error(exc: ApiError) -> ApiError:
    """An error of the chat rules named by the Responses fields."""
    param = exc.param
    if param is not None:
        head, sep, rest = param.partition(".")
        base = re.sub(r"\[\d+\]$", "", head)
        param = _PARAMS[base] if base in _PARAMS else param
    message = re.sub(r"(tools\[\d+\])\.function\b", r"\1", exc.message)
    return ApiError(exc.status, message, param=param, code=exc.code, headers=exc.headers)


def chat_request(body: ResponsesRequest,
                 messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The Chat Completions request the Responses body means (its rules check it)."""
    fields = {"model": body.model, "messages": messages,
              "max_completion_tokens": body.max_output_tokens,
              "temperature": body.temperature, "top_p": body.top_p,
              "stream": bool(body.stream), "user": body.user,
              "tools": _chat_tools(body.tools), "tool_choice": _chat_tool_choice(body.tool_choice),
              "parallel_tool_calls": body.parallel_tool_calls,
              "response_format": _response_format(body.text)}
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        name = ".".join([_PARAMS.get(loc[0], loc[0])] if loc else []) or None
        detail = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise ApiError(400, f"{name}: {detail}" if name else detail, param=name) from None


