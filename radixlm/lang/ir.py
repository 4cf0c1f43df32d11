"""Expressions of the frontend language and the sampling parameters they carry.

A program appends expressions to its state (`s += "text" + gen("x")`). Expressions are plain
data: the interpreter (interpreter.py) executes them against a backend, the tracer
(tracer.py) reads their constant prefix. `+` between expressions (or an expression and a str)
builds an `ExprList`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# The engine's dtype regexes, also sent as `regex` where a backend has no native `dtype` (the
# OpenAI backend). Numbers may end in one space or newline; the interpreter strips it.
from radixlm.constraints.specs import DTYPE_REGEX

_DTYPE_ALIASES = {int: "int", float: "float", bool: "bool", str: "str"}


@dataclass
class SamplingParams:
    """Per-call generation parameters; `None` means "use the run-level default".

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
    json_schema: str | None = None  # normalized to a JSON string

    def merged_over(self, defaults: SamplingParams) -> SamplingParams:
        """Return a copy where every field left `None` here takes the value from `defaults`."""
        values = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(defaults, f.name)
            for f in dataclasses.fields(self)
        }
        return SamplingParams(**values)

    def engine_sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` dict of the native `/generate` API (None fields left out)."""
        keys = (
            "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "stop_regex",
            "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
            "ignore_eos", "dtype", "regex", "json_schema",
        )
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        for key in ("stop", "stop_regex"):
            if out.get(key) == []:
                del out[key]
        if self.n is not None and self.n != 1:
            out["n"] = self.n
        from radixlm.lang.global_config import global_config

        if not global_config.skip_special_tokens_in_output:
            out["skip_special_tokens"] = False
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

    def constraint_regex(self) -> str | None:
        """The regex equivalent of `regex` or `dtype` (for backends without `dtype`)."""
        if self.regex is not None:
            return self.regex
        return DTYPE_REGEX.get(self.dtype) if self.dtype else None


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
    except re.error as e:
        raise ValueError(f"gen: invalid regex {regex!r}: {e}") from e
    return regex


def normalize_json_schema(schema: Any) -> str:
    """Accept a dict, a JSON string or a pydantic model class; check it is a valid schema.

    Returns the schema as a JSON string. Raises ValueError naming what is wrong.
    """
    from radixlm.constraints.schema import check_schema
    from radixlm.constraints.specs import normalize_json_schema as normalize

    try:  # the engine's own parsing and metaschema check, so both sides agree
        text = normalize(schema)
    except ValueError as e:
        raise ValueError(f"gen: {e}") from e
    try:
        check_schema(json.loads(text))
    except ValueError as e:
        raise ValueError(f"gen: invalid json_schema ({e})") from e
    return text


class Expr:
    """Base of all expressions. `a + b` concatenates into an ExprList."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([to_expr(other), self])

    def flatten(self) -> Iterator[Expr]:
        """Yield the leaf expressions in order."""
        yield self


def to_expr(value: Any) -> Expr:
    """Turn a str into a ConstantText; pass expressions through; TypeError otherwise."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return ConstantText(value)
    raise TypeError(
        f"cannot append a {type(value).__name__} to a program state; "
        "use a str or a radixlm expression (gen, select, user, ...)"
    )


@dataclass(eq=False)
class ExprList(Expr):
    exprs: list[Expr]

    def flatten(self) -> Iterator[Expr]:
        for e in self.exprs:
            yield from e.flatten()


@dataclass(eq=False)
class ConstantText(Expr):
    value: str


@dataclass(eq=False)
class Gen(Expr):
    name: str | None
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float
    method: Any  # choices.ChoicesSamplingMethod


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """After `expr` ran: split the reasoning out of each gen/select variable it set (see
    reasoning.py); the variable keeps the answer, `<name>_reasoning_content` the reasoning."""

    model_type: str
    expr: Expr

    def flatten(self) -> Iterator[Expr]:
        yield self


@dataclass(eq=False)
class Media(Expr):
    """`image(...)` / `video(...)`: refused when appended (no model here takes vision input)."""

    kind: str
    source: Any


@dataclass(eq=False)
class CommitLazy(Expr):
    """Send the text so far to the backend's prefix cache (used before a fork)."""


class Argument(Expr):
    """A placeholder for a program argument while tracing (see tracer.py).

    Concatenation works (so the constant text before it is kept); any other use — str(),
    iteration, attribute access, truth value — stops the trace.
    """

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        from radixlm.lang.tracer import StopTracing

        raise StopTracing(f"argument {self._name!r} used")

    __str__ = __format__ = __iter__ = __len__ = __bool__ = __getitem__ = _stop
    __call__ = __int__ = __float__ = __eq__ = __lt__ = __gt__ = __contains__ = _stop
    __hash__ = object.__hash__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._stop()

    def __repr__(self) -> str:
        return f"Argument({self._name!r})"
