"""Per-request sampling parameters, validated before a request is queued.

The bounds below are the one place where limits on sampling parameters live: the engine
checks them here, and the HTTP server's request models (`server/validation.py`) are built
from the same numbers so /openapi.json states them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

_CONSTRAINT_KEYS = ("regex", "json_schema", "choices", "dtype", "ebnf", "structural_tag")
# SGLang sampling parameters this engine cannot honour: a 400 / ValueError naming them.
UNSUPPORTED = {
    "custom_params": "custom logit processors are not supported",
}
# SGLang spells the per-request seed `sampling_seed`; `seed` is the OpenAI spelling.
ALIASES = {"sampling_seed": "seed"}

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


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    # token id (as a string, as in JSON, or an int) -> value added to its logit
    logit_bias: dict[str, float] | None = None
    stream_interval: int | None = None  # stream every this many tokens (None: every token)
    regex: str | None = None
    json_schema: Any = None
    choices: list[str] | None = None
    dtype: str | None = None
    whitespace_pattern: str | None = None
    ebnf: str | None = None  # GBNF or Lark grammar (llguidance backend)
    structural_tag: Any = None  # SGLang's {"structures": [...], "triggers": [...]}

    @classmethod
    def from_dict(cls, params: dict | None) -> SamplingParams:
        """Build and validate; ``None`` values mean default; unknown keys are an error."""
        if params is None:
            params = {}
        if isinstance(params, SamplingParams):
            params.validate()
            return params
        if not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(params).__name__}")
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

    def constraint_kinds(self) -> list[str]:
        return [k for k in _CONSTRAINT_KEYS if getattr(self, k) is not None]

    def validate(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 0)
        _check_int("min_new_tokens", self.min_new_tokens, 0)
        _check_int("n", self.n, 1)
        if self.n > MAX_N:
            raise ValueError(f"n must be <= {MAX_N}, got {self.n}")
        _check_int("top_k", self.top_k, -1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1, got 0")
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
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
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
        kinds = self.constraint_kinds()
        if len(kinds) > 1:
            raise ValueError(f"at most one constraint per request, got {', '.join(kinds)}")
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
