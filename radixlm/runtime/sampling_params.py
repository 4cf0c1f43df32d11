"""Per-request sampling parameters: the one `SamplingParams` and its validation.

Every entry point builds one `SamplingParams` per request and validates it once: the engine
from a dict (`from_dict`), the HTTP server from a request body (it hands the validated
object to the engine, which takes it as it is). The bounds below and each field's metadata
(`accepts`: what `from_dict` takes for it besides None; `bounds`: its numeric and length
limits) are the one statement of the contract: the server's request models are derived
from them, so /openapi.json states what `validate` enforces.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from annotated_types import Len, MaxLen

CONSTRAINT_KEYS = ("regex", "json_schema", "choices", "dtype", "ebnf", "structural_tag")
# SGLang sampling parameters this engine cannot honour: a 400 / ValueError naming them.
UNSUPPORTED = {
    "custom_params": "custom logit processors are not supported",
}
# SGLang spells the per-request seed `sampling_seed`; `seed` is the OpenAI spelling. vLLM
# spells SGLang's `thinking_budget` `thinking_token_budget`.
ALIASES = {"sampling_seed": "seed", "thinking_token_budget": "thinking_budget"}

# Bounds shared by every entry point (engine API, /generate, /v1/*).
MAX_N = 64  # samples per prompt
MAX_STOP = 16  # stop strings (and stop regexes) per request
MAX_STOP_LEN = 256  # characters per stop string
MAX_TOP_LOGPROBS = 20  # top_logprobs_num
TEMPERATURE_RANGE = (0.0, 1e4)  # past ~100 the distribution is flat anyway
OPENAI_TEMPERATURE_RANGE = (0.0, 2.0)  # OpenAI's documented range, on the /v1 routes
PENALTY_RANGE = (-2.0, 2.0)  # frequency_penalty, presence_penalty
# repetition_penalty divides or multiplies logits: near 0 they overflow to inf
REPETITION_PENALTY_RANGE = (0.01, 2.0)

# A stop string, and a list of them, as `from_dict` accepts them (the list arm's limits
# are checked by `validate` on the normalized list either way).
StopText = Annotated[str, Len(1, MAX_STOP_LEN)]
StopTexts = Annotated[list[StopText], MaxLen(MAX_STOP)]


def within(lo_hi: tuple[float, float]) -> dict[str, Any]:
    """`bounds` of a finite number in the closed range `lo_hi`."""
    return {"ge": lo_hi[0], "le": lo_hi[1], "finite": True}


def param(default: Any = None, *, accepts: Any, factory: Any = None, **bounds: Any) -> Any:
    """A SamplingParams field. `accepts`: the type `from_dict` takes for it besides None
    (None means the default); `bounds`: its limits (`ge`, `gt`, `le`, `min_length`, and
    `finite` for numbers that must not be inf or nan), stated as data so request models can
    be derived from them. `validate` enforces them (with its own messages)."""
    meta = {"accepts": accepts, "bounds": bounds}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class SamplingParams:
    """One request's sampling parameters (SGLang's names and defaults).

    Build it with `from_dict` (or construct it and call `validate`). An instance that
    `validate` passed is taken by the engine as it is, without checking it again: change a
    field afterwards and call `validate` again."""

    max_new_tokens: int = param(128, accepts=int, ge=0)
    min_new_tokens: int = param(0, accepts=int, ge=0)
    temperature: float = param(1.0, accepts=float, **within(TEMPERATURE_RANGE))
    top_p: float = param(1.0, accepts=float, gt=0, le=1, finite=True)
    top_k: int = param(-1, accepts=int, ge=-1)
    min_p: float = param(0.0, accepts=float, ge=0, le=1, finite=True)
    frequency_penalty: float = param(0.0, accepts=float, **within(PENALTY_RANGE))
    presence_penalty: float = param(0.0, accepts=float, **within(PENALTY_RANGE))
    repetition_penalty: float = param(1.0, accepts=float, **within(REPETITION_PENALTY_RANGE))
    stop: list[str] = param(factory=list, accepts=StopText | StopTexts)
    stop_token_ids: list[int] = param(factory=list, accepts=int | list[int])
    stop_regex: list[str] = param(factory=list, accepts=str | StopTexts)
    ignore_eos: bool = param(False, accepts=bool)
    skip_special_tokens: bool = param(True, accepts=bool)
    spaces_between_special_tokens: bool = param(True, accepts=bool)
    no_stop_trim: bool = param(False, accepts=bool)
    n: int = param(1, accepts=int, ge=1, le=MAX_N)
    seed: int | None = param(None, accepts=int)
    regex: str | None = param(None, accepts=str)
    json_schema: Any = param(None, accepts=str | dict[str, Any])
    choices: list[str] | None = param(None, accepts=list[str], min_length=1)
    dtype: str | None = param(None, accepts=str)
    whitespace_pattern: str | None = param(None, accepts=str)
    # token id (as a string, as in JSON, or an int) -> value added to its logit
    logit_bias: dict[str, float] | None = param(None, accepts=dict[str, float])
    # stream every this many tokens (None: every token)
    stream_interval: int | None = param(None, accepts=int, ge=1)
    # GBNF or Lark grammar (llguidance backend); any value reaches `validate`, which names
    # what is wrong with it
    ebnf: str | None = param(None, accepts=Any)
    structural_tag: Any = param(None, accepts=Any)  # {"structures": [...], "triggers": [...]}
    # the most tokens of the thinking block before its end tag is forced (the engine's
    # reasoning parser; SGLang's per-request budget, `custom_params.thinking_budget` there)
    thinking_budget: int | None = param(None, accepts=int, ge=0)
    # a constrained output closes a valid document within max_new_tokens (steered onto the
    # grammar's shortest close when the room left reaches it); None: the engine's default
    # for constrained requests (--complete-within-max-tokens)
    complete_within_max_tokens: bool | None = param(None, accepts=bool)

    @classmethod
    def from_dict(cls, params: dict | SamplingParams | None) -> SamplingParams:
        """Build and validate; ``None`` values mean default; unknown keys are an error. An
        instance is validated unless `validate` passed it already, and returned itself."""
        if params is None:
            params = {}
        if isinstance(params, SamplingParams):
            if not params.validated:
                params.validate()
            return params
        if not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(params).__name__}")
        params = _budget_from_custom_params(params)
        for name, why in UNSUPPORTED.items():
            if params.get(name) is not None:
                raise ValueError(f"sampling parameter {name!r} is not supported: {why}")
        params = {k: v for k, v in params.items() if k not in UNSUPPORTED}
        for alias, name in ALIASES.items():
            if alias in params:
                value = params.pop(alias)
                if value is not None and params.get(name) not in (None, value):
                    raise ValueError(f"{alias} and {name} are the same parameter with "
                                     f"different values ({value!r}, {params[name]!r})")
                if value is not None:
                    params[name] = value
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - names)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        kwargs = {k: v for k, v in params.items() if v is not None}
        for key in ("stop", "stop_regex"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = [kwargs[key]]
        if isinstance(kwargs.get("stop_token_ids"), int):
            kwargs["stop_token_ids"] = [kwargs["stop_token_ids"]]
        sp = cls(**kwargs)
        sp.validate()
        return sp

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def validated(self) -> bool:
        """True once `validate` has passed this instance."""
        return self.__dict__.get("_validated", False)

    def constraint_kinds(self) -> list[str]:
        return [k for k in CONSTRAINT_KEYS if getattr(self, k) is not None]

    def with_seed(self, seed: int) -> SamplingParams:
        """A copy with another seed (sample j of n), valid if this one is."""
        copy = dataclasses.replace(self, seed=seed)
        copy._validated = self.validated
        return copy

    def validate(self) -> None:
        """Raise ValueError naming the first value out of bounds (counts, then numbers,
        then flags and stops, then constraints); normalizes `logit_bias` keys to strings."""
        self._validated = False
        self._check_counts()
        self._check_numbers()
        self._check_flags_and_stops()
        self._check_constraints()
        self._validated = True

    def _check_counts(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 0)
        _check_int("min_new_tokens", self.min_new_tokens, 0)
        _check_int("n", self.n, 1)
        if self.n > MAX_N:
            raise ValueError(f"n must be <= {MAX_N}, got {self.n}")
        _check_int("top_k", self.top_k, -1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1, got 0")
        if self.thinking_budget is not None:
            _check_int("thinking_budget", self.thinking_budget, 0)
            if self.thinking_budget > self.max_new_tokens:
                raise ValueError(f"thinking_budget={self.thinking_budget} is above "
                                 f"max_new_tokens={self.max_new_tokens} (max_tokens): the "
                                 "thinking block must fit in the output")

    def _check_numbers(self) -> None:
        _check_range("temperature", self.temperature, TEMPERATURE_RANGE)
        _check_num("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_range("min_p", self.min_p, (0.0, 1.0))
        for name in ("frequency_penalty", "presence_penalty"):
            _check_range(name, getattr(self, name), PENALTY_RANGE)
        _check_range("repetition_penalty", self.repetition_penalty, REPETITION_PENALTY_RANGE)
        if self.seed is not None:
            _check_int("seed", self.seed, None)
        if self.stream_interval is not None:
            _check_int("stream_interval", self.stream_interval, 1)
        if self.logit_bias is not None:
            self.logit_bias = check_logit_bias(self.logit_bias)

    def _check_flags_and_stops(self) -> None:
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        close = self.complete_within_max_tokens
        if close is not None and not isinstance(close, bool):
            raise ValueError(f"complete_within_max_tokens must be a bool, got {close!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        for name in ("stop", "stop_regex"):
            items = getattr(self, name)
            if isinstance(items, list) and len(items) > MAX_STOP:
                raise ValueError(f"{name} takes at most {MAX_STOP} entries, got {len(items)}")
            if isinstance(items, list) and any(isinstance(s, str) and len(s) > MAX_STOP_LEN
                                               for s in items):
                raise ValueError(f"each {name} entry must be at most {MAX_STOP_LEN} characters")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0
                for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be a list of non-negative ints")
        if not isinstance(self.stop_regex, list) or not all(
                isinstance(s, str) for s in self.stop_regex):
            raise ValueError("stop_regex must be a string or a list of strings")
        for pattern in self.stop_regex:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regex: {e}") from None

    def _check_constraints(self) -> None:
        kinds = self.constraint_kinds()
        if len(kinds) > 1:
            raise ValueError(f"at most one constraint per request, got {', '.join(kinds)}")
        if self.complete_within_max_tokens and not kinds:
            raise ValueError("complete_within_max_tokens needs a constraint (regex, "
                             "json_schema, choices, dtype, ebnf or structural_tag): without "
                             "one there is no document to close")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError("regex must be a string")
        if self.choices is not None and (
                not isinstance(self.choices, list | tuple) or not self.choices
                or not all(isinstance(c, str) for c in self.choices)):
            raise ValueError("choices must be a non-empty list of strings")
        if self.dtype is not None and self.dtype not in ("int", "float", "bool", "str"):
            raise ValueError(f"dtype must be one of int, float, bool, str, got {self.dtype!r}")
        if self.ebnf is not None and (not isinstance(self.ebnf, str) or not self.ebnf.strip()):
            raise ValueError("ebnf must be a non-empty grammar string")
        if self.structural_tag is not None and not isinstance(self.structural_tag, str | dict):
            raise ValueError("structural_tag must be a JSON object or its JSON text")
        if isinstance(self.json_schema, str):
            try:
                json.loads(self.json_schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None


def _budget_from_custom_params(params: dict) -> dict:
    """SGLang passes a per-request thinking budget as ``custom_params={"thinking_budget":
    N}`` (its only built-in custom param): that is ``thinking_budget`` here. Other custom
    params stay, to be refused by name."""
    custom = params.get("custom_params")
    if not isinstance(custom, dict) or set(custom) != {"thinking_budget"}:
        return params
    params = {k: v for k, v in params.items() if k != "custom_params"}
    value, given = custom["thinking_budget"], params.get("thinking_budget")
    if given is not None and value is not None and given != value:
        raise ValueError(f"custom_params.thinking_budget and thinking_budget differ "
                         f"({value!r}, {given!r})")
    if value is not None:
        params["thinking_budget"] = value
    return params


def check_logit_bias(bias: Any) -> dict[str, float]:
    """``{token_id: bias}`` with token ids as ints or decimal strings; finite numbers."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be an object of token id -> bias, got {bias!r}")
    out = {}
    for key, value in bias.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.strip().isdigit():
            token = int(key)
        if token is None or token < 0:
            raise ValueError(f"logit_bias key {key!r} is not a token id")
        _check_num(f"logit_bias[{key!r}]", value)
        if abs(value) == float("inf"):
            raise ValueError(f"logit_bias[{key!r}] must be finite")
        out[str(token)] = float(value)
    return out


def _check_int(name: str, value: Any, lo: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")


def _check_num(name: str, value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _check_range(name: str, value: Any, bounds: tuple[float, float]) -> None:
    _check_num(name, value)
    lo, hi = bounds
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")


def check_top_logprobs_num(value: Any) -> None:
    """top_logprobs_num is an int in [0, MAX_TOP_LOGPROBS] (ValueError otherwise)."""
    _check_int("top_logprobs_num", value, 0)
    if value > MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num must be <= {MAX_TOP_LOGPROBS}, got {value}")
