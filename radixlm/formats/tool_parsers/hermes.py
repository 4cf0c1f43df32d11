"""``qwen25`` / ``hermes``: Qwen 2.5's (and Hermes') calls, one block per call,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>

blocks separated by a newline; results come back as ``<tool_response>`` user turns. Also the
format for chat templates no parser recognises (ChatML and unknown ones)."""

from __future__ import annotations

import json
from typing import Any

from radixlm.formats.tool_parsers.base import (
    Section,
    ToolCallParser,
    call_json_text,
    calls_rule,
    json_call,
    public_function,
)
from radixlm.formats.tool_parsers.text import literal_at, read_call, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolCallParser):
    """``<tool_call>\\n{"name", "arguments"}\\n</tool_call>`` blocks."""

    name = "qwen25"
    opener = OPEN
    markers = (OPEN, CLOSE)
    one_section = False

    def section(self, text: str, start: int, final: bool, names: frozenset[str]) -> Section:
        status, call, end = read_call(text, skip_ws(text, start + len(OPEN)), final)
        if status == "open" and (call is None or call.name in names):
            return Section([call] if call is not None else [], None)
        if status != "done" or call is None or call.name not in names:
            return Section([], _block_end(text, start), ok=False)
        j = skip_ws(text, end)  # type: ignore[arg-type]
        at = literal_at(text, j, CLOSE, final)
        if at == "yes":
            return Section([call], j + len(CLOSE))
        if final and j == len(text):  # the output ended right after the call
            return Section([call], j)
        if at == "partial":
            call.stable = False
            return Section([call], None)
        return Section([], _block_end(text, start), ok=False)

    def tools_prompt(self, functions: list[dict[str, Any]]) -> str:
        listing = "\n".join(json.dumps({"type": "function", "function": public_function(f)},
                                       ensure_ascii=False) for f in functions)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query."
                "\n\nYou are provided with function signatures within <tools></tools> XML "
                f"tags:\n<tools>\n{listing}\n</tools>\n\nFor each function call, return a "
                "json object with function name and arguments within <tool_call></tool_call>"
                ' XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
                "<args-json-object>}\n</tool_call>")

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        return "\n".join(f"{OPEN}\n{call_json_text(n, a)}\n{CLOSE}" for n, a in calls)

    def call_rules(self, fns: list[dict[str, Any]], g: Any) -> list[str]:
        rules = [f"obj_{k}: {json_call(g, k, f['name'])}" for k, f in enumerate(fns)]
        rules.append("obj: " + " | ".join(f"obj_{k}" for k in range(len(fns))))
        rules += [f'call_{k}: {g.marker(OPEN)} "\\n" obj_{k} "\\n" {g.marker(CLOSE)}'
                  for k in range(len(fns))]
        return rules

    def required_rule(self, g: Any, many: bool) -> str:
        return calls_rule(many, "\n")

    def auto_segments(self, fns: list[dict[str, Any]], g: Any,
                      many: bool) -> list[tuple[str, str]]:
        return [(OPEN, f'"\\n" obj "\\n" {g.marker(CLOSE)}')]


def _block_end(text: str, start: int) -> int | None:
    """After the ``</tool_call>`` that closes the block at ``start`` (None: not yet)."""
    at = text.find(CLOSE, start)
    return None if at < 0 else at + len(CLOSE)


class NousHermesParser(HermesParser):
    """The same format under SGLang's other name for it."""

    name = "hermes"
