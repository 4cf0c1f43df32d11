"""The Anthropic Messages API's request side: the bodies (`MessagesRequest`,
`CountTokensRequest`) and the Chat Completions request they mean (`chat_request`), whose
rules (the intake's) then check it; errors of those rules named by the Anthropic fields
(`remap_error`). The conversation itself is `messages_content.py`'s.

Fields map as: `system` and `messages` -> chat messages; `max_tokens` -> `max_tokens`;
`stop_sequences` -> `stop`; `temperature`, `top_p`, `top_k` as they are; `metadata.user_id`
-> `user`; `tools` (custom tools: `name`, `description`, `input_schema`, `strict`) -> function
tools; `tool_choice` auto / any / tool / none -> auto / required / the named function / none,
`disable_parallel_tool_use` -> `parallel_tool_calls: false`; `thinking` -> the template's
`enable_thinking` (and `budget_tokens` -> `thinking_budget`); `output_config.format` ->
`response_format` (a strict JSON schema). `cache_control` (top level, on blocks and tools) is
accepted and inert: the radix cache shares every prefix by itself. A field this server cannot
honour is a 400 naming it; so is any field Anthropic does not have.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from radixlm.runtime.sampling_params import StopTexts
from radixlm.server.errors import AnthropicError, ApiError
from radixlm.server.messages_content import bad, cache_control, conversation
from radixlm.server.protocol import ChatCompletionRequest

# fields of Anthropic's API this server cannot honour: a 400 naming them when set
_UNSUPPORTED = ("container", "mcp_servers", "context_management", "diagnostics",
                "inference_geo", "user_profile_id", "workspace_id")
_TOOL_FIELDS = {"type", "name", "description", "input_schema", "cache_control", "strict",
                "defer_loading", "input_examples", "allowed_callers", "eager_input_streaming"}
_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}
# chat spellings in the intake's messages -> the Anthropic field (regex, replacement)
_NAMES = ((r"\bmax_(new|completion)_tokens\b", "max_tokens"),
          (r"\bthinking_budget\b", "thinking.budget_tokens"),
          (r"'stop'", "'stop_sequences'"), (r"\bresponse_format\b", "output_config.format"),
          (r"tool_choice 'required'", "tool_choice 'any'"),
          (r"tool_choice 'named'", "tool_choice 'tool'"),
          (r"\btools\[(\d+)\]\.function\.parameters\b", r"tools.\1.input_schema"),
          (r"\btools\[(\d+)\](\.function)?", r"tools.\1"))


def validation_message(errors: Sequence[Any]) -> str:
    """Pydantic's errors (of a body) as one message naming the first field, Anthropic's way
    (`messages.0.role: ...`)."""
    first = errors[0] if errors else {}
    # (without "body" and the union-branch tags pydantic puts in locations: "str",
    # "list[any]", "ToolChoice", "constrained-str")
    loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body" and not (
        isinstance(x, str) and (x[:1].isupper() or "[" in x or "-" in x or x in _TAGS)))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return "the request body is not valid JSON"
    detail = {"extra_forbidden": "Extra inputs are not permitted",
              "missing": "Field required"}.get(kind) or str(
                  first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{loc}: {detail}" if loc else detail


# ---------------------------------------------------------------- request bodies


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _check(self) -> ThinkingConfig:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError("budget_tokens is required with type 'enabled' (and only "
                             "with it)")
        return self


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name is required with type 'tool' (and only with it)")
        return self


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    format: OutputFormat | None = None
    effort: str | None = None  # no effort levels here: a 400 when set


class Metadata(_Strict):
    user_id: str | None = Field(default=None, max_length=256)


class CountTokensRequest(_Strict):
    """Body of POST /v1/messages/count_tokens (the prompt fields of a Messages request)."""

    model: str
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: Any = None  # checked by `cache_control` (and inert)
    speed: Literal["standard"] | None = None
    container: Any = None
    mcp_servers: Any = None
    context_management: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    @model_validator(mode="after")
    def _check_supported(self) -> CountTokensRequest:
        for name in _UNSUPPORTED:
            if getattr(self, name, None) not in (None, [], {}):
                raise ValueError(f"{name}: not supported by this server")
        if self.output_config is not None and self.output_config.effort is not None:
            raise ValueError("output_config.effort: not supported by this server")
        return self

    def sampling(self) -> dict[str, Any]:
        """The chat request's fields that are not the prompt's (none for counting)."""
        return {}


class MessagesRequest(CountTokensRequest):
    """Body of POST /v1/messages (Anthropic's fields; others are a 400 naming them).
    Not Anthropic's: `thinking.budget_tokens` may be below 1024."""

    max_tokens: int = Field(ge=0)  # 0: prefill only (fills the radix cache), as documented
    stop_sequences: StopTexts | None = None  # the engine's bounds (count, length)
    temperature: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=1)
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier: standard
    diagnostics: Any = None
    inference_geo: Any = None

    @model_validator(mode="after")
    def _check_budget(self) -> MessagesRequest:
        t = self.thinking
        if t is not None and t.budget_tokens is not None and t.budget_tokens >= self.max_tokens:
            raise ValueError(f"thinking.budget_tokens: must be less than max_tokens "
                             f"({t.budget_tokens} >= {self.max_tokens})")
        return self

    def sampling(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "stop": self.stop_sequences,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "stream": self.stream,
                "user": self.metadata.user_id if self.metadata is not None else None}


# ---------------------------------------------------------------- body -> chat request


def _chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Custom tools as chat function tools (strict only with `strict: true`); no tools
    (None or []) is None."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise bad(where, "must be a tool object")
        if tool.get("type") not in (None, "custom"):
            raise bad(f"{where}.type", f"{tool['type']!r} tools are not supported by this "
                      "server (custom tools only: name, description, input_schema)")
        unknown = sorted(set(tool) - _TOOL_FIELDS)
        if unknown:
            raise bad(f"{where}.{unknown[0]}", "Extra inputs are not permitted")
        for name in ("input_examples", "allowed_callers"):
            if tool.get(name) is not None:
                raise bad(f"{where}.{name}", "not supported by this server")
        if tool.get("eager_input_streaming") is False:  # true: a call streams as it is written
            raise bad(f"{where}.eager_input_streaming", "false is not supported by this server")
        if tool.get("defer_loading"):
            raise bad(f"{where}.defer_loading", "not supported by this server (no tool search)")
        cache_control(f"{where}.cache_control", tool.get("cache_control"))
        if not isinstance(tool.get("input_schema"), dict):
            raise bad(f"{where}.input_schema", "required (a JSON schema object)")
        if not isinstance(tool.get("strict") or False, bool):
            raise bad(f"{where}.strict", "must be a boolean")
        fn = {"name": tool.get("name"), "parameters": tool["input_schema"],
              "strict": bool(tool.get("strict"))}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: ToolChoice | None) -> dict[str, Any]:
    if choice is None:
        return {}
    out: dict[str, Any] = {"tool_choice": {
        "auto": "auto", "any": "required", "none": "none",
        "tool": {"type": "function", "function": {"name": choice.name}}}[choice.type]}
    if choice.disable_parallel_tool_use is not None:
        out["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return out


def _thinking(thinking: ThinkingConfig | None, reasoning_parser: str | None) -> dict[str, Any]:
    """The chat fields of `thinking`: the template's `enable_thinking` switch, and the
    budget; thinking on needs a reasoning parser (to split it off the answer)."""
    if thinking is None:
        return {}
    if thinking.type == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    if reasoning_parser is None:
        raise bad("thinking", f"type {thinking.type!r} needs a model with a reasoning parser "
                  "(start the server with --reasoning-parser)")
    return {"chat_template_kwargs": {"enable_thinking": True},
            "thinking_budget": thinking.budget_tokens}


def chat_request(body: CountTokensRequest, reasoning_parser: str | None
                 ) -> tuple[ChatCompletionRequest, list[str]]:
    """(the Chat Completions request ``body`` means, the Anthropic path of each of its
    messages for `remap_error`); AnthropicError 400 naming the field it cannot take."""
    if not body.messages:
        raise bad("messages", "at least one message is required")
    cache_control("cache_control", body.cache_control)
    conv = conversation(body.system, body.messages)
    fmt = body.output_config.format if body.output_config is not None else None
    fields = {"model": body.model, "messages": conv.messages,
              "continue_final_message": conv.prefill, "tools": _chat_tools(body.tools),
              **_chat_tool_choice(body.tool_choice), **_thinking(body.thinking,
                                                                 reasoning_parser),
              "response_format": None if fmt is None else {
                  "type": "json_schema", "json_schema": {"name": "output",
                                                         "schema": fmt.json_schema,
                                                         "strict": True}},
              **body.sampling()}
    try:
        chat = ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise remap_error(ApiError(400, validation_message(exc.errors())),
                          conv.origins) from None
    return chat, conv.origins


def remap_error(exc: ApiError, origins: list[str]) -> AnthropicError:
    """An error of the chat rules in Anthropic's shape, named by the Anthropic fields
    (``origins``: the Anthropic path of each chat message, `messages[3]` -> `messages.2`)."""
    def rename(text: str) -> str:
        text = re.sub(r"\bmessages\[(\d+)\]", lambda m: origins[int(m[1])]
                      if int(m[1]) < len(origins) else m[0], text)
        for pattern, repl in _NAMES:
            text = re.sub(pattern, repl, text)
        return text

    return AnthropicError(exc.status, rename(exc.message),
                          param=rename(exc.param) if exc.param else None, code=exc.code,
                          headers=exc.headers)
