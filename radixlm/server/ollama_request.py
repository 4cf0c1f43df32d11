"""The Ollama API's request side: the bodies of `/api/chat`, `/api/generate` and `/api/show`,
the served model's Ollama name (`ollama_name`, `check_model`), and the Chat Completions
request a body means (`chat_request`, `generate_request`), whose rules (the intake's) then
check it; errors of those rules named by the Ollama fields (`remap_error`).

Fields map as: `messages` -> chat messages (`ollama_messages.py`); `tools` as they are (the
shape is OpenAI's); `format` "json" -> `response_format` json_object, a JSON schema ->
json_schema (as given, not made strict); `options.temperature`, `top_p`, `top_k`, `seed` (-1:
random), `num_predict` (-1 / -2: the rest of the context) -> `max_tokens`, `stop`,
`repeat_penalty` -> `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `min_p`;
`think` -> the template's `enable_thinking` (true needs a reasoning parser); `logprobs`,
`top_logprobs` as they are. `options.num_ctx` up to the server's context length is accepted
(the context is the server's), `num_keep` is inert (the context is never shifted, so
nothing is discarded), `keep_alive` is checked and inert (the one model stays loaded).
Options this server cannot honour are a 400 naming them unless at their neutral value
(`_NEUTRAL`); so is any field Ollama does not have.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from radixlm.runtime.sampling_params import MAX_TOP_LOGPROBS, OPENAI_TEMPERATURE_RANGE, within
from radixlm.server.errors import ApiError, OllamaError
from radixlm.server.messages_request import validation_message
from radixlm.server.ollama_messages import bad, chat_messages
from radixlm.server.protocol import ChatCompletionRequest
from radixlm.server.sampling_body import sampling_field
from radixlm.server.state import ServerState

# Ollama options this server cannot honour, and the values at which they change nothing
# (Ollama's defaults): any other value is a 400 naming the option
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "numa": (False,), "num_batch": (512,), "num_gpu": (-1,), "main_gpu": (0,),
    "low_vram": (False,), "f16_kv": (True,), "logits_all": (False,), "vocab_only": (False,),
    "use_mmap": (True,), "use_mlock": (False,), "embedding_only": (False,), "num_thread": (0,),
    "tfs_z": (1.0,), "typical_p": (1.0,), "mirostat": (0,), "penalize_newline": (True,)}
_PENALTIES = ("repeat_penalty", "presence_penalty", "frequency_penalty")
# a Go duration ("5m", "1h30m", "-1s") or a number of seconds, as keep_alive takes them
_DURATION = re.compile(r"-?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?((\d+(\.\d*)?|\.\d+)"
                       r"(ns|us|µs|ms|s|m|h))*")
_SCHEMA = re.compile(r"json[_ ]schema", re.I)  # the engine's words for a refused schema
# chat spellings in the intake's messages -> the Ollama field (regex, replacement)
_NAMES = ((r"\bmax_(new_|completion_)?tokens\b", "options.num_predict"),
          (r"\bresponse_format\b", "format"), (r"\brepetition_penalty\b", "options.repeat_penalty"),
          (r"'stop'", "'options.stop'"),
          (r"^(stop|seed|temperature|top_[pk]|min_p|presence_penalty|frequency_penalty)\b",
           r"options.\1"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _opt(name: str, **override: Any) -> Any:
    """The Field (default None, the engine's bounds) of SamplingParams field ``name``."""
    return sampling_field(name, **override)[1]


class Options(_Strict):
    """`options` (Ollama's names; the bounds are the engine's, temperature's OpenAI's)."""

    temperature: float | None = _opt("temperature", bounds=within(OPENAI_TEMPERATURE_RANGE))
    top_p: float | None = _opt("top_p")
    top_k: int | None = _opt("top_k")
    min_p: float | None = _opt("min_p")
    seed: int | None = None  # -1: random
    num_predict: int | None = Field(default=None, ge=-2)  # -1, -2: the rest of the context
    stop: list[str] | None = None  # checked as the chat route's `stop`
    repeat_penalty: float | None = _opt("repetition_penalty")
    presence_penalty: float | None = _opt("presence_penalty")
    frequency_penalty: float | None = _opt("frequency_penalty")
    num_ctx: int | None = Field(default=None, ge=1)
    num_keep: int | None = Field(default=None, ge=-1)  # inert: the context is never shifted
    repeat_last_n: int | None = Field(default=None, ge=-1)
    mirostat_tau: float | None = None  # inert while mirostat is 0 (the only value taken)
    mirostat_eta: float | None = None
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    tfs_z: float | None = None
    typical_p: float | None = None
    mirostat: int | None = None
    penalize_newline: bool | None = None

    @model_validator(mode="after")
    def _check_neutral(self) -> Options:
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value not in neutral:
                raise ValueError(f"options.{name}: {value!r} is not supported by this server "
                                 f"(only {neutral[0]!r}, Ollama's default)")
        penalised = any(getattr(self, p) not in (None, 0.0 if p != "repeat_penalty" else 1.0)
                        for p in _PENALTIES)
        if self.repeat_last_n not in (None, -1) and penalised:
            raise ValueError(f"options.repeat_last_n: {self.repeat_last_n} is not supported "
                             "by this server with a penalty set: repeat_penalty covers the "
                             "whole context (-1), presence and frequency penalties the output")
        return self

    def generation_options(self) -> list[str]:
        """The options set that change only generation (not num_ctx, nor those of
        `_NEUTRAL`, which change loading): the ones an embedding cannot take."""
        return [name for name in type(self).model_fields
                if name != "num_ctx" and name not in _NEUTRAL and getattr(self, name) is not None]

    def chat_fields(self, context_len: int) -> dict[str, Any]:
        """The chat request's sampling fields (None: the default)."""
        if self.num_ctx is not None and self.num_ctx > context_len:
            raise bad("options.num_ctx", f"{self.num_ctx} is over this server's context "
                      f"length ({context_len} tokens)")
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "min_p": self.min_p, "seed": None if self.seed == -1 else self.seed,
                "max_tokens": None if self.num_predict in (-1, -2) else self.num_predict,
                "stop": self.stop, "repetition_penalty": self.repeat_penalty,
                "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty}


def check_keep_alive(alive: str | float | None) -> None:
    """ValueError naming `keep_alive` unless it is a duration or a number (it is inert)."""
    if isinstance(alive, str) and not _DURATION.fullmatch(alive.strip()):
        raise ValueError(f"keep_alive: {alive!r} is not a duration (e.g. '5m', '1h', "
                         "'-1', or a number of seconds)")


class _Body(_Strict):
    """The fields `/api/chat` and `/api/generate` share."""

    model: str = Field(min_length=1)
    format: str | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True  # Ollama streams unless told not to
    keep_alive: str | float | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _check_common(self) -> _Body:
        check_keep_alive(self.keep_alive)
        if isinstance(self.format, str) and self.format not in ("", "json"):
            raise ValueError(f"format: {self.format!r} is not a format ('json' or a JSON "
                             "schema object)")
        if isinstance(self.think, str):
            raise ValueError(f"think: {self.think!r}: thinking levels are not supported by "
                             "this server (true or false)")
        return self


class ChatBody(_Body):
    """Body of POST /api/chat."""

    messages: list[Any] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_Body):
    """Body of POST /api/generate."""

    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[Any] | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None

    @model_validator(mode="after")
    def _check_supported(self) -> GenerateBody:
        refusals = {
            "suffix": "not supported by this server (no fill-in-the-middle)",
            "template": "custom (Go) templates are not supported by this server; the model's "
                        "chat template is used (raw: true sends the prompt as it is)",
            "context": "not supported by this server (send the conversation to /api/chat)",
            "images": "not supported by this server (the model takes text only)",
            "width": "image generation is not supported", "height":
                "image generation is not supported", "steps": "image generation is not "
                                                              "supported"}
        for name, why in refusals.items():
            if getattr(self, name) not in (None, "", []):
                raise ValueError(f"{name}: {why}")
        if self.raw and self.system:
            raise ValueError("system: has no effect with raw: true (the prompt is sent as it "
                             "is)")
        if self.raw and self.think is not None:
            raise ValueError("think: needs the chat template (raw: true sends the prompt as "
                             "it is)")
        return self


class ShowBody(_Strict):
    """Body of POST /api/show (`name` is Ollama's older spelling of `model`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False

    @model_validator(mode="after")
    def _check(self) -> ShowBody:
        if not (self.model or self.name):
            raise ValueError("model: Field required")
        if self.verbose:
            raise ValueError("verbose: not supported by this server (no tokenizer arrays "
                             "in model_info)")
        return self


# ---------------------------------------------------------------- the model's name


def ollama_name(state: ServerState) -> str:
    """The served model as Ollama names it (`name:tag`; `latest` unless the name has one)."""
    name = state.model_id
    return name if ":" in name else f"{name}:latest"


def check_model(state: ServerState, model: str) -> None:
    """OllamaError 404 unless ``model`` names the served model (with or without its tag, or
    `default`)."""
    full = ollama_name(state)
    if model not in (full, full.removesuffix(":latest"), state.model_id, "default"):
        raise OllamaError(404, f"model {model!r} not found (this server serves {full!r})",
                          param="model")


# ---------------------------------------------------------------- body -> chat request


def _format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if not fmt:
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}


def _think(think: bool | str | None, reasoning_parser: str | None,
           model: str) -> dict[str, Any]:
    if think is None:
        return {}
    if not think:
        return {"chat_template_kwargs": {"enable_thinking": False}}
    if reasoning_parser is None:
        raise bad("think", f"{model!r} does not support thinking (start the server with "
                  "--reasoning-parser)")
    return {"chat_template_kwargs": {"enable_thinking": True}}


def _chat(fields: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise remap_error(ApiError(400, validation_message(exc.errors()))) from None


def _common(body: _Body, state: ServerState, reasoning_parser: str | None) -> dict[str, Any]:
    """The chat fields of what `/api/chat` and `/api/generate` share."""
    options = body.options or Options()
    return {"model": body.model, "response_format": _format(body.format),
            "stream": body.stream, "logprobs": body.logprobs,
            "top_logprobs": body.top_logprobs, **options.chat_fields(state.context_len),
            **_think(body.think, reasoning_parser, ollama_name(state))}


def chat_request(body: ChatBody, state: ServerState,
                 reasoning_parser: str | None) -> ChatCompletionRequest:
    """The Chat Completions request ``body`` (with messages) means; OllamaError 400 naming
    the field it cannot take."""
    return _chat({**_common(body, state, reasoning_parser),
                  "messages": chat_messages(body.messages), "tools": body.tools or None})


def generate_request(body: GenerateBody, state: ServerState,
                     reasoning_parser: str | None) -> ChatCompletionRequest:
    """The Chat Completions request ``body`` (with a prompt) means: the prompt as the user
    turn after `system`. With `raw` the caller sends the prompt itself and takes only the
    sampling fields from it."""
    messages = [{"role": "system", "content": body.system}] if body.system else []
    messages.append({"role": "user", "content": body.prompt})
    return _chat({**_common(body, state, reasoning_parser), "messages": messages})


def remap_error(exc: ApiError, fmt: Any = None) -> OllamaError:
    """An error of the chat rules or the engine in Ollama's shape, named by the Ollama
    fields; with a ``fmt`` (the request's `format`), a schema the grammar refuses names
    `format`."""
    if isinstance(exc, OllamaError):
        return exc
    message, param = exc.message, exc.param
    if fmt and exc.status == 400 and (_SCHEMA.search(message)
                                      or exc.code == "invalid_constraint"):
        return OllamaError(400, f"format: {message}", param="format", code=exc.code)
    for pattern, repl in _NAMES:
        message = re.sub(pattern, repl, message)
        param = re.sub(pattern, repl, param) if param else param
    return OllamaError(exc.status, message, param=param, code=exc.code, headers=exc.headers)
