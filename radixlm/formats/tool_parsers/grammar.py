"""A request's tool grammar: Lark text for llguidance (sent as the request's ``ebnf``).

``tool_choice`` "required" / named: the whole output is the family's call form (one call,
or one or more where parallel calls are allowed), each function's arguments JSON under its
``parameters`` schema (``%json``, with the schema rewrites and separators the engine's own
``json_schema`` constraint uses; with ``strict: true`` every object that leaves
``additionalProperties`` open is closed first). "auto": SGLang's structural tag, written
out as llguidance writes one: free text in which a trigger (the family's marker: a special
token where the tokenizer has one, else a lazily matched literal) starts a section in the
family's form, constrained the same way; text may follow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from radixlm.constraints.specs import DEFAULT_SEPARATORS
from radixlm.formats.tool_parsers.base import LarkText, lit
from radixlm.formats.tool_parsers.setup import ToolSetup, strict_schema

TokenOf = Callable[[str], "int | None"]


def json_options(whitespace: str | None) -> dict[str, Any]:
    """llguidance's JSON options: the engine's whitespace rule (``EngineConfig.
    json_whitespace``; None: ``", "`` and ``": "`` separators, nothing else)."""
    style = ({"whitespace_pattern": whitespace} if whitespace is not None else
             dict(zip(("item_separator", "key_separator"), DEFAULT_SEPARATORS, strict=True)))
    return {"whitespace_flexible": False, **style, "lenient": False}


def grammar_schema(schema: Any, strict: bool, whitespace: str | None = None) -> dict[str, Any]:
    """The schema as llguidance's JSON compiler is given it; ValueError naming a keyword it
    would not enforce."""
    from radixlm.constraints.schema.llg_rewrite import prepare_schema, unenforced_keywords

    schema = strict_schema(schema) if strict else schema
    bad = unenforced_keywords(schema)
    if bad:
        raise ValueError(f"unsupported JSON Schema keyword {bad[0]}")
    out = prepare_schema(schema)
    out = {} if out is True else out
    if not isinstance(out, dict):  # `false`: nothing is valid
        raise ValueError("the schema allows no value")
    return {**out, "x-guidance": json_options(whitespace)}


def function_grammar(fn: dict[str, Any], whitespace: str | None = None) -> str:
    """A grammar of function ``fn``'s arguments alone (to check that it compiles)."""
    return "start: %json " + json.dumps(grammar_schema(fn["parameters"], fn["strict"],
                                                       whitespace), ensure_ascii=False)


def check_functions(setup: ToolSetup, validate: Callable[[str], None],
                    whitespace: str | None = None) -> None:
    """Compile-check each callable function's arguments grammar with ``validate`` (the
    engine's grammar backend); ValueError naming the function that fails."""
    for fn in setup.selected:
        try:
            validate(function_grammar(fn, whitespace))
        except ValueError as exc:
            raise ValueError(f"{fn['where']}.function.parameters (function {fn['name']!r}) "
                             f"cannot be compiled into a grammar: {exc}") from None


def build(setup: ToolSetup, token_of: TokenOf, whitespace: str | None = None) -> str:
    """The Lark grammar of ``setup`` in its format; ``token_of(text)`` is the id of the
    token ``text`` is in the tokenizer (None: not one token)."""
    parser, fns, g = setup.parser, setup.selected, LarkText(token_of)
    lines = ["%llguidance {}"]
    for k, fn in enumerate(fns):
        if parser.json_arguments:
            schema = grammar_schema(fn["parameters"], fn["strict"], whitespace)
            lines.append(f"{g.args(k)}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines += parser.call_rules(fns, g)
    lines.append("call: " + " | ".join(f"call_{k}" for k in range(len(fns))))
    many = setup.max_calls is None
    if setup.whole_output_is_call:
        lines.append("start: " + parser.required_rule(g, many))
        return "\n".join(lines)
    segments = []
    for i, (trigger, body) in enumerate(parser.auto_segments(fns, g, many)):
        if g.has_token(trigger):
            lines.append(f"seg_{i}: TEXT {g.marker(trigger)} {body}")
        else:
            lines.append(f"seg_{i}_trig[lazy]: TEXT {lit(trigger)}")
            lines.append(f"seg_{i}: seg_{i}_trig {body}")
        segments.append(f"seg_{i}")
    repeat = "*" if many and not parser.one_section else "?"
    lines.append(f"start: ({' | '.join(segments)}){repeat} TEXT")
    lines.append("TEXT: /(.|\\n)*/")
    return "\n".join(lines)


def token_lookup(encode: Callable[[str], list[int]]) -> TokenOf:
    """``token_of`` for ``build`` from a tokenizer's ``encode`` (no special tokens added):
    the id when the text is exactly one token."""
    seen: dict[str, int | None] = {}

    def token_of(text: str) -> int | None:
        if text not in seen:
            ids = encode(text)
            seen[text] = int(ids[0]) if len(ids) == 1 else None
        return seen[text]

    return token_of


def tool_sampling(setup: ToolSetup, token_of: TokenOf,
                  whitespace: str | None = None) -> dict[str, Any]:
    """The sampling parameters that make an output follow ``setup``: its grammar as
    ``ebnf``, and ``skip_special_tokens`` false where a marker of the format is a token (so
    the markers stay in the text the parser reads). Empty for an inactive setup."""
    if not setup.active:
        return {}
    out: dict[str, Any] = {"ebnf": build(setup, token_of, whitespace)}
    if any(token_of(m) is not None for m in setup.parser.markers):
        out["skip_special_tokens"] = False
    return out
