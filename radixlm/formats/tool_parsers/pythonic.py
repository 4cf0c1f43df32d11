"""``pythonic``: Llama 3.2 / 3.3 / 4's Python-style calls, one list of them,

    [get_weather(city="Oslo", unit="celsius"), get_time(city="Rome")]

keyword arguments with Python literal values (``True`` / ``False`` / ``None``; ``true`` /
``false`` / ``null`` are read too). The list is read whole with Python's parser (``ast``,
never evaluated). The grammar writes each keyword in the order of ``properties``, required
ones always; a value of type boolean or null, or one from an ``enum`` / ``const``, in
Python's spelling, any other value as JSON under its schema (so a nested ``true`` is JSON's).
A function must take named properties only, with names that are Python identifiers."""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
from typing import Any

from radixlm.formats.tool_parsers import base
from radixlm.formats.tool_parsers.grammar import grammar_schema
from radixlm.formats.tool_parsers.text import ParsedCall, python_end, skip_ws

_NEVER = re.compile(r"(?!)")
_CALL_OPEN = re.compile(r"([A-Za-z_]\w*)\(")
_JSON_NAMES = {"true": True, "false": False, "null": None}
_TOP_KEYS = {"type", "properties", "required", "additionalProperties", "description", "title",
             "$defs", "definitions", "$schema"}


class PythonicParser(base.ToolCallParser):
    """``[f(a=1, b="x"), g()]``."""

    name = "pythonic"
    json_arguments = False

    def start_re(self, names: frozenset[str]) -> re.Pattern:
        if not names:
            return _NEVER
        alts = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        return re.compile(r"\[\s*(?:" + alts + r")\(")

    def hold_prefixes(self, names: frozenset[str]) -> tuple[str, ...]:
        return tuple(f"[{n}(" for n in names)

    def section(self, text: str, start: int, final: bool, names: frozenset[str]) -> base.Section:
        end = python_end(text, start)
        if end is None:
            return base.BAD_OPEN if final else base.Section(_calls_so_far(text, start, names), None)
        try:
            tree = ast.parse(text[start:end], mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                raise ValueError("not a list of calls")
            return base.Section([_call(e, names) for e in tree.elts], end)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return base.Section([], end, ok=False)

    def check_function(self, where: str, fn: dict[str, Any]) -> None:
        name, params = fn["name"], fn["parameters"]
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{where}.function.name {name!r} is not a Python identifier, "
                             "which the pythonic tool-call format needs")
        props = params.get("properties", {})
        if set(params) - _TOP_KEYS or params.get("type", "object") != "object" \
                or not isinstance(props, dict):
            raise ValueError(f"{where}.function.parameters (function {name!r}): the pythonic "
                             "tool-call format needs an object schema of named properties "
                             f"(keys {sorted(_TOP_KEYS)})")
        bad = [p for p in props if not p.isidentifier() or keyword.iskeyword(p)]
        if bad:
            raise ValueError(f"{where}.function.parameters (function {name!r}): property "
                             f"{bad[0]!r} is not a Python identifier (a keyword argument)")

    def tools_prompt(self, functions: list[dict[str, Any]]) -> str:
        listing = json.dumps([base.public_function(f) for f in functions], indent=2,
                             ensure_ascii=False)
        return ("You can call functions. To call one or more, answer with nothing but a "
                "Python list of calls with keyword arguments, in the format [func_name1("
                "params_name1=params_value1, params_name2=params_value2...), "
                "func_name2(params)]. Otherwise answer normally.\n\nThe functions, in JSON "
                f"format:\n{listing}")

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        parts = []
        for name, args in calls:
            values = json.loads(args) if args.strip() else {}
            parts.append(f"{name}(" + ", ".join(f"{k}={_py(v)}" for k, v in values.items())
                         + ")")
        return "[" + ", ".join(parts) + "]"

    def result_message(self, content: str) -> dict[str, str]:
        return {"role": "ipython", "content": content}

    def call_rules(self, fns: list[dict[str, Any]], g: Any) -> list[str]:
        rules: list[str] = []
        for k, fn in enumerate(fns):
            rules += _keyword_rules(k, fn)
            kw = f" first_{k}_0" if fn["parameters"].get("properties") else ""
            rules.append(f'call_{k}: {base.lit(fn["name"] + "(")}{kw} ")"')
        return rules

    def required_rule(self, g: Any, many: bool) -> str:
        return f'"[" {base.calls_rule(many, ", ")} "]"'

    def auto_segments(self, fns: list[dict[str, Any]], g: Any,
                      many: bool) -> list[tuple[str, str]]:
        more = f' ({base.lit(", ")} call)*' if many else ""
        return [(f"[{fn['name']}(",
                 (f"first_{k}_0 " if fn["parameters"].get("properties") else "")
                 + f'")"{more} "]"') for k, fn in enumerate(fns)]


def _keyword_rules(k: int, fn: dict[str, Any]) -> list[str]:
    """Rules first_k_j / rest_k_j: the keywords from property j on, in order, each optional
    one possibly left out, separated by ", " (first_: none written before; rest_: some)."""
    params = fn["parameters"]
    props = list(params.get("properties", {}).items())
    required = set(params.get("required", []))
    defs = {d: params[d] for d in ("$defs", "definitions") if d in params}
    n, rules = len(props), []
    for j, (name, schema) in enumerate(props):
        rules.append(f"kv_{k}_{j}: {base.lit(name + '=')} {_value(schema, defs, fn['strict'])}")
        rest_next = f" rest_{k}_{j + 1}" if j + 1 < n else ""
        first_next = f"first_{k}_{j + 1}" if j + 1 < n else ""
        if name in required:
            rules.append(f'rest_{k}_{j}: ", " kv_{k}_{j}{rest_next}')
            rules.append(f"first_{k}_{j}: kv_{k}_{j}{rest_next}")
        else:
            rules.append(f'rest_{k}_{j}: (", " kv_{k}_{j})?{rest_next}')
            alt = f" | {first_next}" if first_next else ""
            rules.append(f"first_{k}_{j}: (kv_{k}_{j}{rest_next}{alt})"
                         + ("" if first_next else "?"))
    return rules


def _value(schema: Any, defs: dict[str, Any], strict: bool) -> str:
    """Lark for one keyword's value (see the module's note on spellings)."""
    if isinstance(schema, dict):
        values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if isinstance(values, list) and values and all(
                v is None or isinstance(v, str | int | float | bool) for v in values):
            return "(" + " | ".join(base.lit(_py(v)) for v in values) + ")"
        kind = schema.get("type")
        if kind == "boolean" and set(schema) <= {"type", "description", "title"}:
            return '("True" | "False")'
        if kind == "null":
            return '"None"'
    schema = {**schema, **defs} if isinstance(schema, dict) else schema
    return "%json " + json.dumps(grammar_schema(schema, strict), ensure_ascii=False)


def _py(v: Any) -> str:
    """A JSON value in Python literal spelling (strings double-quoted, as JSON writes)."""
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_py(x)}"
                               for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


def _literal(node: ast.AST) -> Any:
    """The JSON value of a Python literal node; ValueError for anything else."""
    if isinstance(node, ast.Constant) and (node.value is None
                                           or isinstance(node.value, str | bool | int)
                                           or (isinstance(node.value, float)
                                               and math.isfinite(node.value))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant)
                                          and isinstance(k.value, str) for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd) \
            and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, int | float) \
            and not isinstance(node.operand.value, bool):
        value = _literal(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("tool call arguments must be literals")


def _call(node: ast.AST, names: frozenset[str]) -> ParsedCall:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in names and not node.args
            and all(kw.arg is not None for kw in node.keywords)):
        raise ValueError("not a call of a known function with keyword arguments")
    args = {kw.arg: _literal(kw.value) for kw in node.keywords}
    return ParsedCall(node.func.id, json.dumps(args, ensure_ascii=False))


def _calls_so_far(text: str, start: int, names: frozenset[str]) -> list[ParsedCall]:
    """The calls of a list still open at the end of the text (unstable): the complete ones,
    then the one being written (name only)."""
    calls: list[ParsedCall] = []
    k = skip_ws(text, start + 1)
    while True:
        m = _CALL_OPEN.match(text, k)
        if m is None or m.group(1) not in names:
            return calls
        end = python_end(text, m.end() - 1)
        if end is None:
            return calls + [ParsedCall(m.group(1), "", done=False, stable=False)]
        try:
            call = _call(ast.parse(text[k:end], mode="eval").body, names)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return calls
        call.stable = False
        calls.append(call)
        k = skip_ws(text, end)
        if not text.startswith(",", k):
            return calls
        k = skip_ws(text, k + 1)
