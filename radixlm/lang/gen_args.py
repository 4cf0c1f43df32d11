"""`GenArgs`: the arguments of one `gen()` call, their checks, and their one mapping to the
runtime's wire format.

`gen()` builds a `GenArgs` from its keyword arguments and checks it (`checked`), so bad
values fail where the program is written. The interpreter merges it over the run-level
defaults (`merged_over`), and every backend turns it into a request with `wire_request`:
SGLang's native request fields (`sampling_params` dict plus the logprob options), as
`Engine.generate` and `POST /generate` take them. The OpenAI backend maps that same dict onto
the OpenAI API. JSON schemas are parsed here; the metaschema check happens where the request
is compiled (the engine or the server), so the frontend needs no grammar engine.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

# The engine's dtype names and regexes (also sent as `regex` by the OpenAI backend) and its
# parsing of a JSON schema (dict, JSON text or pydantic model class), so both sides agree.
from radixlm.constraints.specs import DTYPE_REGEX
from radixlm.constraints.specs import normalize_json_schema as _schema_text
from radixlm.lang.global_config import global_config
from radixlm.lang.tools import check_tool_fields

_DTYPE_ALIASES = {int: "int", float: "float", bool: "bool", str: "str"}
_JSON_TYPES = frozenset(("array", "boolean", "integer", "null", "number", "object", "string"))

# GenArgs fields that go into the wire `sampling_params` dict under their own name.
_SAMPLING_FIELDS = (
    "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "stop_regex",
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "ignore_eos", "dtype", "regex", "json_schema", "ebnf", "thinking_budget",
    "complete_within_max_tokens",
)


@dataclass
class GenArgs:
    """Per-call generation arguments; `None` means "use the run-level default".

    Field names follow SGLang's frontend (`max_new_tokens` is `gen(max_tokens=...)`).
    """

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None  # > 1: the variable becomes a list of n samples (text gets the first)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: str | None = None
    regex: str | None = None
    json_schema: str | None = None  # a JSON string once `checked`
    # tool use (lang/tools.py): the OpenAI fields, checked by `checked`; the backend's
    # format turns them into `ebnf` and `skip_special_tokens` when the gen runs
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    ebnf: str | None = None
    skip_special_tokens: bool | None = None
    # tokens the model may think before its answer (a server / engine reasoning parser)
    thinking_budget: int | None = None
    # a constrained output closes a valid document within max_new_tokens
    complete_within_max_tokens: bool | None = None

    def merged_over(self, defaults: GenArgs) -> GenArgs:
        """Return a copy where every field left `None` here takes the value from `defaults`."""
        values = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(defaults, f.name)
            for f in dataclasses.fields(self)
        }
        return GenArgs(**values)

    def checked(self) -> GenArgs:
        """Validate the values `gen()` was given and return them normalized (stop lists,
        dtype names, the schema as JSON text). ValueError/TypeError name what is wrong."""
        _check_int("max_tokens", self.max_new_tokens, 0)
        _check_int("min_tokens", self.min_new_tokens, 0)
        _check_int("n", self.n, 1)
        _check_int("thinking_budget", self.thinking_budget, 0)
        close = self.complete_within_max_tokens
        if close is not None and not isinstance(close, bool):
            raise TypeError(f"gen: complete_within_max_tokens must be a bool, got {close!r}")
        if close and self.regex is None and self.json_schema is None and self.dtype is None \
                and self.ebnf is None and self.tools is None:
            raise ValueError("gen: complete_within_max_tokens needs a constraint (regex, "
                             "json_schema or dtype): without one there is no document to close")
        stop_regex = [self.stop_regex] if isinstance(self.stop_regex, str) else self.stop_regex
        for pattern in stop_regex or ():
            validate_regex(pattern)
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"gen: temperature must be >= 0, got {self.temperature}")
        if self.tools is not None or self.tool_choice is not None:
            check_tool_fields(self.tools, self.tool_choice, self.parallel_tool_calls)
        return dataclasses.replace(
            self, stop=[self.stop] if isinstance(self.stop, str) else self.stop,
            stop_regex=stop_regex, dtype=normalize_dtype(self.dtype),
            regex=validate_regex(self.regex) if self.regex is not None else None,
            json_schema=(normalize_json_schema(self.json_schema)
                         if self.json_schema is not None else None))

    # ---- the wire format ---------------------------------------------------------------

    def engine_sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` dict of the native `/generate` API (None fields left out),
        with the detokenization settings of `global_config` where they differ from the
        engine's defaults."""
        out = {k: getattr(self, k) for k in _SAMPLING_FIELDS if getattr(self, k) is not None}
        for key in ("stop", "stop_regex"):
            if out.get(key) == []:
                del out[key]
        if self.n is not None and self.n != 1:
            out["n"] = self.n
        if not global_config.skip_special_tokens_in_output:
            out["skip_special_tokens"] = False
        if self.skip_special_tokens is not None:
            out["skip_special_tokens"] = self.skip_special_tokens
        if not global_config.spaces_between_special_tokens_in_out:
            out["spaces_between_special_tokens"] = False
        return out

    def logprob_kwargs(self) -> dict[str, Any]:
        """The logprob options of the native API (only when logprobs are asked for)."""
        if not self.return_logprob:
            return {}
        out: dict[str, Any] = {"return_logprob": True}
        if self.logprob_start_len is not None:
            out["logprob_start_len"] = self.logprob_start_len
        if self.top_logprobs_num is not None:
            out["top_logprobs_num"] = self.top_logprobs_num
        if self.return_text_in_logprobs is not None:
            out["return_text_in_logprobs"] = self.return_text_in_logprobs
        return out

    def wire_request(self) -> dict[str, Any]:
        """The request fields of `Engine.generate` / `POST /generate` besides the prompt:
        `sampling_params` and the logprob options."""
        return {"sampling_params": self.engine_sampling_params(), **self.logprob_kwargs()}


def constraint_regex(sampling_params: dict[str, Any]) -> str | None:
    """The regex equivalent of a wire dict's `regex` or `dtype` (for APIs without `dtype`)."""
    if "regex" in sampling_params:
        return sampling_params["regex"]
    dtype = sampling_params.get("dtype")
    return DTYPE_REGEX.get(dtype) if dtype else None


def _check_int(name: str, value: Any, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < minimum):
        raise ValueError(f"gen: {name} must be an int >= {minimum}, got {value!r}")


def normalize_dtype(dtype: Any) -> str | None:
    """Map `int`/`"int"`/... to the API's dtype string; ValueError on anything else."""
    if dtype is None:
        return None
    name = _DTYPE_ALIASES.get(dtype, dtype)
    if name not in DTYPE_REGEX:
        raise ValueError(f"gen: dtype must be one of int, float, bool, str; got {dtype!r}")
    return name


def validate_regex(regex: str) -> str:
    """Compile `regex` eagerly so a bad pattern fails where it is written."""
    if not isinstance(regex, str):
        raise TypeError(f"gen: regex must be a str, got {type(regex).__name__}")
    try:
        re.compile(regex)
    except (re.error, RecursionError) as e:
        raise ValueError(f"gen: invalid regex {regex!r}: {e}") from e
    return regex


def normalize_json_schema(schema: Any) -> str:
    """Accept a dict, a JSON string or a pydantic model class; return it as JSON text.

    Checked here: that it parses, that it is a JSON object (or boolean), and that a top-level
    `type` names JSON types. The full metaschema check is the engine's, when it compiles the
    request. Raises ValueError naming what is wrong.
    """
    try:
        text = _schema_text(schema)
    except ValueError as e:
        raise ValueError(f"gen: {e}") from e
    top = json.loads(text)
    types = top.get("type") if isinstance(top, dict) else None
    names = types if isinstance(types, list) else [types]
    if types is not None and (not names or not all(
            isinstance(t, str) and t in _JSON_TYPES for t in names)):
        raise ValueError(f"gen: invalid json_schema (type {types!r} at /type is not one of "
                         f"{sorted(_JSON_TYPES)} or a list of them)")
    return text
