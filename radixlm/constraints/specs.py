"""What a constraint is (``ConstraintSpec``: exactly one of ``regex``, ``json_schema``,
``choices``, ``dtype``, ``ebnf``, ``structural_tag`` per request, normalized and hashable) and
how one is read from sampling parameters. Plain Python (no grammar engine): the frontend
imports it too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixlm.constraints import regex_parts as rp

CONSTRAINT_KINDS = ("regex", "json_schema", "choices", "dtype", "ebnf", "structural_tag")

# JSON text by default: ", " between items, ": " after keys, no other whitespace (what
# json.dumps writes, and xgrammar's separators without flexible whitespace).
DEFAULT_SEPARATORS = (", ", ": ")
# The deepest JSON a schema (or a structural tag) may be: llguidance's JSON reader (serde_json's
# default limit) refuses a deeper grammar, and JSONSchemaBench's deepest schema is 22.
MAX_JSON_DEPTH = 128


@dataclass(frozen=True)
class ConstraintSpec:
    """One constraint. ``value`` is a regex str, a JSON-schema str (already serialized,
    canonical), a tuple of choice strings, a dtype name ("int", "float", "bool", "str"), a
    GBNF/Lark grammar str (``ebnf``) or SGLang's structural-tag object as JSON text.
    ``whitespace_pattern`` applies to JSON schemas only: a regex allowed between any two
    JSON tokens (``""``: none), or None for the DEFAULT_SEPARATORS style."""

    kind: str
    value: Any
    whitespace_pattern: str | None = None


# dtype -> regex of the whole output. "str" is a JSON string literal (quotes included).
# Numbers may end in one space or newline (as in SGLang): without a way to say "done" other
# than EOS, a small model can run on in digits until max_new_tokens. Callers strip it.
NUMBER_END = r"[ \n]?"
DTYPE_REGEX: dict[str, str] = {
    "int": rp.INTEGER + NUMBER_END,
    "float": rp.NUMBER + NUMBER_END,
    "bool": rp.BOOLEAN,
    "str": rp.STRING,
}


def choices_regex(choices: tuple[str, ...]) -> str:
    """Alternation of the escaped literal choices."""
    return "(?:" + "|".join(rp.literal_regex(c) for c in choices) + ")"


def load_json_schema(value: Any) -> dict | bool:
    """A pydantic model class, a dict or a JSON string -> the schema as a JSON value;
    ValueError names what is wrong."""
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        value = value.model_json_schema()
    elif isinstance(value, str):
        value = _loads(value, "json_schema")
    elif not isinstance(value, (dict, bool)):
        raise ValueError("json_schema must be a dict, a JSON string or a pydantic model class, "
                         f"got {type(value).__name__}")
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"json_schema must be a JSON object, got {type(value).__name__}")
    check_depth(value, "json_schema")
    return value


def check_depth(value: Any, what: str) -> None:
    """ValueError naming ``what`` when the JSON value ``value`` nests deeper than
    ``MAX_JSON_DEPTH`` (llguidance's JSON reader refuses such a grammar, and the schema
    walks before it are recursive). Iterative: any depth is measured."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels of JSON")
        if type(node) is dict or type(node) is list:
            stack.extend((v, depth + 1) for v in (node.values() if type(node) is dict else node)
                         if type(v) is dict or type(v) is list)


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:  # (the parser's own nesting limit, ~1,000 levels)
        raise ValueError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels of JSON") from None


def normalize_json_schema(value: Any) -> str:
    """A pydantic model class, a dict or a JSON string -> compact JSON text. Key order is
    kept (it is the order properties are generated in), so equal dicts give equal text."""
    return json.dumps(load_json_schema(value), separators=(",", ":"), ensure_ascii=False)


def structural_tag_object(value: Any) -> dict:
    """SGLang's structural tag (a dict, a pydantic model or JSON text) as a dict; ValueError
    when it is not a JSON object."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True, exclude_none=True)
    if isinstance(value, str):
        value = _loads(value, "structural_tag")
    if not isinstance(value, dict):
        raise ValueError("structural_tag must be a JSON object with structures and triggers")
    check_depth(value, "structural_tag")
    return value


def normalize_structural_tag(value: Any) -> str:
    """SGLang's structural tag (a dict, a pydantic model or JSON text) -> compact JSON text."""
    return json.dumps(structural_tag_object(value), separators=(",", ":"), ensure_ascii=False)


def spec_from_sampling_params(params: Any,
                              whitespace: str | None = None) -> ConstraintSpec | None:
    """The constraint named in ``params`` (a dict, or an object with those attributes such
    as ``SamplingParams``; None if no constraint). Raises ValueError if more than one kind is
    given or a value has the wrong type. ``whitespace_pattern`` (JSON only) overrides the
    engine's default ``whitespace`` (``EngineConfig.json_whitespace``; None: the
    DEFAULT_SEPARATORS style, ``""``: no whitespace)."""
    if not isinstance(params, dict):
        params = {k: getattr(params, k, None) for k in (*CONSTRAINT_KINDS, "whitespace_pattern")}
    given = [k for k in CONSTRAINT_KINDS if params.get(k) is not None]
    if len(given) > 1:
        raise ValueError(f"at most one constraint per request, got {', '.join(given)}")
    ws = params.get("whitespace_pattern")
    if ws is not None and (not given or given[0] != "json_schema"):
        raise ValueError("whitespace_pattern applies to json_schema only")
    if ws is not None and not isinstance(ws, str):
        raise ValueError("whitespace_pattern must be a string")
    if not given:
        return None
    kind = given[0]
    value = params[kind]
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise ValueError("regex must be a non-empty string")
        return ConstraintSpec("regex", value)
    if kind == "json_schema":
        return ConstraintSpec("json_schema", normalize_json_schema(value),
                              ws if ws is not None else whitespace)
    if kind == "choices":
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            raise ValueError("choices must be a non-empty list of strings")
        if not all(isinstance(c, str) and c for c in value):
            raise ValueError("choices must be non-empty strings")
        return ConstraintSpec("choices", tuple(value))
    if kind == "ebnf":
        if not isinstance(value, str) or not value.strip():
            raise ValueError("ebnf must be a non-empty grammar string")
        return ConstraintSpec("ebnf", value)
    if kind == "structural_tag":
        return ConstraintSpec("structural_tag", normalize_structural_tag(value))
    if value not in DTYPE_REGEX:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_REGEX)}, got {value!r}")
    return ConstraintSpec("dtype", value)
