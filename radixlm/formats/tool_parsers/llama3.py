"""``llama3``: Llama 3.1 / 3.2 / 3.3 JSON tool calls,

    {"name": "get_weather", "parameters": {"city": "Oslo"}}

optionally after ``<|python_tag|>``, several separated by ``;`` (SGLang's separator);
``"arguments"`` is read as well as ``"parameters"``. A call is a call once its object is
complete: what follows a broken one is content. Results go back in the ``ipython`` role,
as Llama's templates write them."""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.formats.tool_parsers.base import (
    BAD_OPEN,
    Section,
    ToolCallParser,
    call_json_text,
    calls_rule,
    json_call,
    lit,
    public_function,
)
from radixlm.formats.tool_parsers.text import ParsedCall, read_call, skip_ws

PYTHON_TAG = "<|python_tag|>"
_START = re.compile(re.escape(PYTHON_TAG) + r'|\{\s*"name"\s*:')
_TRIGGER = '{"name": "'
_PARAMS = '"parameters": '


class Llama3Parser(ToolCallParser):
    """JSON objects with ``parameters``, ``;``-separated, optionally after the python tag."""

    name = "llama3"
    markers = (PYTHON_TAG,)

    def start_re(self, names: frozenset[str]) -> re.Pattern:
        return _START

    def hold_prefixes(self, names: frozenset[str]) -> tuple[str, ...]:
        return (PYTHON_TAG, '{"name":')

    def section(self, text: str, start: int, final: bool, names: frozenset[str]) -> Section:
        i = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
        calls: list[ParsedCall] = []
        while True:
            i = skip_ws(text, i)
            status, call, end = read_call(text, i, final)
            if status == "open" and (call is None or call.name in names):
                return Section(calls + ([call] if call is not None else []), None)
            if status != "done" or call is None or call.name not in names:
                # calls read so far stand; the rest is text (a broken first call: all of it)
                return Section(calls, i) if calls else \
                    (Section([], end, ok=False) if end is not None else BAD_OPEN)
            calls.append(call)
            j = skip_ws(text, end)  # type: ignore[arg-type]
            if j < len(text) and text[j] == ";":
                i = j + 1
                continue
            if j == len(text) and not final:  # a ';' may follow
                return Section(calls, None)
            return Section(calls, end)

    def tools_prompt(self, functions: list[dict[str, Any]]) -> str:
        listing = "\n\n".join(json.dumps({"type": "function", "function": public_function(f)},
                                         indent=4, ensure_ascii=False) for f in functions)
        return ("Given the following functions, please respond with a JSON for a function "
                "call with its proper arguments that best answers the given prompt.\n\n"
                'Respond in the format {"name": function name, "parameters": dictionary of '
                "argument name and its value}. Do not use variables.\n\n" + listing)

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        return ";".join(call_json_text(n, a, "parameters") for n, a in calls)

    def result_message(self, content: str) -> dict[str, str]:
        return {"role": "ipython", "content": content}

    def call_rules(self, fns: list[dict[str, Any]], g: Any) -> list[str]:
        rules = [f"call_{k}: {json_call(g, k, f['name'], 'parameters')}"
                 for k, f in enumerate(fns)]
        # what follows the auto trigger '{"name": "'
        rules += [f'rest_{k}: {lit(f["name"] + chr(34) + ", " + _PARAMS)} {g.args(k)} "}}"'
                  for k, f in enumerate(fns)]
        rules.append("rest: " + " | ".join(f"rest_{k}" for k in range(len(fns))))
        return rules

    def required_rule(self, g: Any, many: bool) -> str:
        tag = f"{g.marker(PYTHON_TAG)}? " if g.has_token(PYTHON_TAG) else ""
        return tag + calls_rule(many, ";")

    def auto_segments(self, fns: list[dict[str, Any]], g: Any,
                      many: bool) -> list[tuple[str, str]]:
        more = f' ({lit(";")} call)*' if many else ""
        segments = [(_TRIGGER, "rest" + more)]
        if g.has_token(PYTHON_TAG):
            segments.append((PYTHON_TAG, "call" + more))
        return segments
