"""Request bodies of the HTTP API as pydantic models.

Native (`/generate`) follows SGLang's `GenerateReqInput`: fields we cannot honour (images,
LoRA, ...) are rejected when set, and so are fields SGLang does not have. OpenAI bodies
follow the OpenAI API: unknown fields are an error, as on api.openai.com, except the
documented extras (`regex`, `choices`, `json_schema`, `top_k`, ...).
Responses are built as plain dicts in `native.py` / `openai_api.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from radixlm.runtime.sampling_params import (
    CONSTRAINT_KEYS,
    MAX_N,
    MAX_TOP_LOGPROBS,
    OPENAI_TEMPERATURE_RANGE,
    check_logit_bias,
    within,
)
from radixlm.server.sampling_body import SamplingParamsBody, sampling_field

# SGLang GenerateReqInput fields we cannot serve: a value other than the default is a 400.
NATIVE_UNSUPPORTED: dict[str, Any] = {
    "image_data": None, "video_data": None, "audio_data": None, "use_audio_in_video": False,
    "input_embeds": None, "lora_path": None, "lora_id": None, "session_params": None,
    "custom_logit_processor": None, "token_ids_logprob": None, "return_hidden_states": False,
    "return_routed_experts": False, "return_indexer_topk": False,
    "routed_experts_start_len": 0, "positional_embed_overrides": None,
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
    "bootstrap_pair_key": None, "decode_tp_size": None, "require_reasoning": False,
    "disagg_prefill_dp_rank": None, "background": False, "extra_key": None,
    "routing_key": None, "custom_labels": None, "return_bytes": False,
    "return_entropy": False, "external_trace_header": None, "need_wait_for_mm_inputs": None,
    "num_items_assigned": None, "max_dynamic_patch": None, "min_dynamic_patch": None,
    "image_max_dynamic_patch": None, "video_max_dynamic_patch": None,
    "multi_item_delimiter_indices": None,
    "model": None,  # sglang-router writes "model": null into every /generate it forwards
}
# SGLang fields that are bookkeeping only; honoured as such: conversation_id and
# received_time are not used, no_logs holds (request content is never logged).
NATIVE_INERT = ("conversation_id", "received_time", "no_logs")


class GenerateRequest(BaseModel):
    """Body of POST /generate (SGLang's GenerateReqInput, the subset a single engine serves).
    Every other GenerateReqInput field is either inert (NATIVE_INERT) or a 400 when set
    (NATIVE_UNSUPPORTED); a field SGLang does not have is a 400 too."""

    model_config = ConfigDict(extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParamsBody | list[SamplingParamsBody] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: (Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]
                       | list[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]] | None) = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    log_metrics: bool = True
    modalities: list[str] | None = None
    priority: int | None = None
    # with a reasoning parser: the answer in `text`, the thinking in `reasoning_text` (the
    # shape of SGLang's /separate_reasoning); None means true then; false: the raw text
    separate_reasoning: bool | None = None
    # one engine: DP rank 0 is the only one (sglang-router may name it)
    routed_dp_rank: int | None = None
    data_parallel_rank: int | None = None

    @model_validator(mode="after")
    def _check(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of 'text' and 'input_ids' must be given")
        extra = self.model_extra or {}
        unknown = sorted(k for k in extra if k not in NATIVE_UNSUPPORTED
                         and k not in NATIVE_INERT)
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(unknown)}")
        for name, default in NATIVE_UNSUPPORTED.items():
            if extra.get(name, default) not in (default, None, [], {}, ""):
                raise ValueError(f"'{name}' is not supported by this server")
        if self.modalities and set(self.modalities) - {"text"}:
            raise ValueError(f"'modalities' {self.modalities} are not supported: this server "
                             "takes text only")
        for name in ("routed_dp_rank", "data_parallel_rank"):
            if getattr(self, name) not in (None, 0):
                raise ValueError(f"'{name}'={getattr(self, name)}: this server is one data-"
                                 "parallel rank (0)")
        return self

    @property
    def is_batch(self) -> bool:
        """True for a list of prompts (or a list of token-id lists)."""
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    @property
    def prompts(self) -> list[tuple[str | None, list[int] | None]]:
        """One (text, input_ids) pair per prompt, exactly one of the two set."""
        if self.text is not None:
            texts = self.text if isinstance(self.text, list) else [self.text]
            return [(t, None) for t in texts]
        ids = self.input_ids if self.is_batch else [self.input_ids]
        return [(None, list(x)) for x in ids]  # type: ignore[arg-type]


class StreamOptions(BaseModel):
    """OpenAI `stream_options`."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaSpec(BaseModel):
    """OpenAI `response_format.json_schema`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI `response_format`: text, json_object or json_schema; or SGLang's structural_tag
    (`structures`: [{begin, schema, end}], `triggers`: [str])."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaSpec | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.json_schema is None):
            raise ValueError("response_format.json_schema.schema is required for type "
                             "'json_schema'")
        if (self.type == "structural_tag") != (self.structures is not None
                                               or self.triggers is not None):
            raise ValueError("response_format.structures and .triggers go with type "
                             "'structural_tag' (and it needs them)")
        return self


class _SamplingName:
    """An OpenAI body field that is SamplingParams field `field` under the OpenAI name;
    its type and bounds are the field's, but for what `override` replaces."""

    def __init__(self, field: str, **override: Any) -> None:
        self.field = field
        self.spec = sampling_field(field, **override)


# The fields shared by /v1/completions and /v1/chat/completions, in the document's order:
# the ones that are SamplingParams fields (the one table the routes map names through), and
# OpenAI's own.
_OPENAI_FIELDS: dict[str, Any] = {
    "model": (str | None, None),
    "temperature": _SamplingName("temperature", bounds=within(OPENAI_TEMPERATURE_RANGE)),
    "top_p": _SamplingName("top_p"),
    "n": (int, Field(default=1, ge=1, le=MAX_N)),  # fanned out by the server
    "stream": (bool, False),
    "stream_options": (StreamOptions | None, None),
    "stop": _SamplingName("stop"),
    "presence_penalty": _SamplingName("presence_penalty"),
    "frequency_penalty": _SamplingName("frequency_penalty"),
    "logit_bias": _SamplingName("logit_bias"),
    "seed": _SamplingName("seed"),
    "user": (str | None, None),
    "response_format": (ResponseFormat | None, None),
    # extras (SGLang / vLLM style), passed via the client's extra_body
    "regex": _SamplingName("regex"),
    "choices": _SamplingName("choices", bounds={}),
    "json_schema": _SamplingName("json_schema"),
    "ebnf": _SamplingName("ebnf", accepts=str),
    "top_k": _SamplingName("top_k"),
    "min_p": _SamplingName("min_p"),
    "repetition_penalty": _SamplingName("repetition_penalty"),
    "min_tokens": _SamplingName("min_new_tokens"),
    "ignore_eos": _SamplingName("ignore_eos"),
    "stop_token_ids": _SamplingName("stop_token_ids", accepts=list[int]),
    "skip_special_tokens": _SamplingName("skip_special_tokens"),
    "no_stop_trim": _SamplingName("no_stop_trim"),
    "rid": (str | None, None),
    "priority": (int | None, None),  # SGLang: scheduling priority (--schedule-policy priority)
    # SGLang's per-request thinking budget (needs --reasoning-parser); vLLM's spelling too
    "thinking_budget": _SamplingName("thinking_budget"),
    "thinking_token_budget": (int | None, Field(default=None, ge=0)),
    # close the constrained document within max_tokens (null: the server's default)
    "complete_within_max_tokens": _SamplingName("complete_within_max_tokens"),
    # SGLang fields its router writes into every forwarded request (at these defaults)
    "return_hidden_states": (bool, False),
}
# OpenAI name -> SamplingParams field, for the body fields that are sampling parameters
OPENAI_SAMPLING = {name: spec.field for name, spec in _OPENAI_FIELDS.items()
                   if isinstance(spec, _SamplingName)}
# the constraint fields among them, in the order an error lists them
OPENAI_CONSTRAINTS = tuple(name for name, field in OPENAI_SAMPLING.items()
                           if field in CONSTRAINT_KEYS)


class _OpenAIChecks(BaseModel):
    """The checks of the fields shared by both OpenAI routes (`_OpenAIBase`)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _check_base(self) -> _OpenAIChecks:
        if self.logit_bias is not None:
            self.logit_bias = check_logit_bias(self.logit_bias)
        if self.return_hidden_states:
            raise ValueError("'return_hidden_states' is not supported by this server")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        constraints = self.constraint_fields()
        if len(constraints) > 1:
            raise ValueError(f"at most one constraint may be given, got {', '.join(constraints)}")
        if self.thinking_token_budget is not None:  # vLLM's name of the same field
            if self.thinking_budget not in (None, self.thinking_token_budget):
                raise ValueError("'thinking_budget' and 'thinking_token_budget' are the same "
                                 f"field with different values ({self.thinking_budget}, "
                                 f"{self.thinking_token_budget})")
            self.thinking_budget = self.thinking_token_budget
        return self

    def constraint_fields(self) -> list[str]:
        """The constraint fields the body gives (`OPENAI_CONSTRAINTS` in order, then a
        `response_format` other than text): at most one, and none beside active tools."""
        given = [k for k in OPENAI_CONSTRAINTS if getattr(self, k)]
        if self.response_format is not None and self.response_format.type != "text":
            given.append("response_format")
        return given


_OpenAIBase: Any = create_model(
    "_OpenAIBase", __base__=_OpenAIChecks, __module__=__name__,
    __doc__="Fields shared by /v1/completions and /v1/chat/completions (incl. our extras).",
    **{name: spec.spec if isinstance(spec, _SamplingName) else spec
       for name, spec in _OPENAI_FIELDS.items()})


class CompletionRequest(_OpenAIBase):
    """Body of POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("'suffix' is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("'best_of' other than n is not supported by this server")
        if self.echo and self.logprobs is not None and self.stream:
            raise ValueError("'echo' together with 'logprobs' is not supported when streaming")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("'prompt' must not be empty")
        return self

    @property
    def prompts(self) -> list[tuple[str | None, list[int] | None]]:
        """One (text, input_ids) pair per prompt."""
        p = self.prompt
        if isinstance(p, str):
            return [(p, None)]
        if all(isinstance(x, str) for x in p):
            return [(x, None) for x in p]  # type: ignore[misc]
        if all(isinstance(x, int) for x in p):
            return [(None, list(p))]  # type: ignore[arg-type]
        return [(None, list(x)) for x in p]  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message content as one string (text parts joined); other parts are an error."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"unsupported content part type {part.get('type')!r}; "
                                 "only 'text' parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_OpenAIBase):
    """Body of POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # SGLang's: with a reasoning parser (--reasoning-parser), the thinking is returned as
    # `reasoning_content` (false: left in `content`), streamed as it comes (false: in one
    # delta once it has ended); without one, either value changes nothing (as in SGLang)
    separate_reasoning: bool = True
    stream_reasoning: bool = True

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("'top_logprobs' requires 'logprobs' to be true")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("'continue_final_message' needs an assistant message last")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        """max_completion_tokens, else max_tokens, else None (up to the context)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens
