"""``deepseekv3``: DeepSeek V3 (0324) calls in its tool-call tokens,

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Oslo"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(SGLang's ``deepseekv3_detector``). Calls read so far stand when a later one is broken; the
rest is content."""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.formats.tool_parsers import base
from radixlm.formats.tool_parsers.text import ParsedCall, literal_at, skip_ws, value_end

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE, FENCE_END = "\n```json\n", "\n```"
OUT_BEGIN, OUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
_HEAD = re.compile(re.escape(CALL_BEGIN) + r"(\w*)" + re.escape(SEP) + r"([^\n]*)"
                   + re.escape(FENCE))
_TAIL = re.compile(r"\s*```\s*" + re.escape(CALL_END))


class DeepSeekV3Parser(base.ToolCallParser):
    """Calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``."""

    name = "deepseekv3"
    opener = CALLS_BEGIN
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def section(self, text: str, start: int, final: bool, names: frozenset[str]) -> base.Section:
        calls: list[ParsedCall] = []
        i = start + len(CALLS_BEGIN)
        while True:
            i = skip_ws(text, i)
            if i == len(text):
                return (base.Section(calls, i) if calls else base.BAD_OPEN) if final \
                    else base.Section(calls, None)
            if calls and literal_at(text, i, CALLS_END, final) != "no":
                return base.Section(calls, i + len(CALLS_END)) if text.startswith(CALLS_END, i) \
                    else base.Section(calls, None)
            status, call, end = _read_call(text, i, final, names)
            if status == "open":
                return base.Section(calls + ([call] if call is not None else []), None)
            if status == "bad":
                return base.Section(calls, i) if calls else base.BAD_OPEN
            calls.append(call)  # type: ignore[arg-type]
            i = end  # type: ignore[assignment]

    def tools_prompt(self, functions: list[dict[str, Any]]) -> str:
        listing = "\n\n".join(
            f"- `{f['name']}`:\n```json\n{json.dumps(base.public_function(f), ensure_ascii=False)}"
            "\n```" for f in functions)
        return ("## Tools\n\n### Function\n\nYou have the following functions available:\n\n"
                f"{listing}\n\nTo call functions, answer with {CALLS_BEGIN}, then per call "
                f"{CALL_BEGIN}function{SEP}<function name>{FENCE}<arguments as a JSON object>"
                f"{FENCE_END}{CALL_END}, then {CALLS_END}.")

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        return CALLS_BEGIN + "\n".join(f"{CALL_BEGIN}function{SEP}{n}{FENCE}{a}{FENCE_END}"
                                       f"{CALL_END}" for n, a in calls) + CALLS_END

    def result_message(self, content: str) -> dict[str, str]:
        return {"role": "user", "content": f"{OUT_BEGIN}{content}{OUT_END}"}

    def call_rules(self, fns: list[dict[str, Any]], g: Any) -> list[str]:
        lit = base.lit
        return [f'call_{k}: {g.marker(CALL_BEGIN)} "function" {g.marker(SEP)} '
                f"{lit(f['name'] + FENCE)} {g.args(k)} {lit(FENCE_END)} {g.marker(CALL_END)}"
                for k, f in enumerate(fns)]

    def required_rule(self, g: Any, many: bool) -> str:
        return f"{g.marker(CALLS_BEGIN)} {base.calls_rule(many, chr(10))} {g.marker(CALLS_END)}"

    def auto_segments(self, fns: list[dict[str, Any]], g: Any,
                      many: bool) -> list[tuple[str, str]]:
        return [(CALLS_BEGIN, f"{base.calls_rule(many, chr(10))} {g.marker(CALLS_END)}")]


def _read_call(text: str, i: int, final: bool,
               names: frozenset[str]) -> tuple[str, ParsedCall | None, int | None]:
    """One ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` at ``text[i]``: ("done", call,
    end), ("open", call so far or None, None) or ("bad", None, None)."""
    m = _HEAD.match(text, i)
    if m is None:
        if final or literal_at(text, i, CALL_BEGIN, final) == "no" \
                or CALL_END in text[i:] or FENCE in text[i:]:
            return "bad", None, None
        return "open", None, None
    name = m.group(2).strip()
    if m.group(1) != "function" or name not in names:
        return "bad", None, None
    v = value_end(text, m.end())
    if v is None:
        return ("bad", None, None) if final else \
            ("open", ParsedCall(name, text[m.end():], done=False, stable=False), None)
    raw = text[m.end():v]
    try:
        if not isinstance(json.loads(raw), dict):
            return "bad", None, None
    except ValueError:
        return "bad", None, None
    tail = _TAIL.match(text, v)
    if tail is not None:
        return "done", ParsedCall(name, raw), tail.end()
    rest = re.sub(r"\s+", "", text[v:])
    if not final and ("```" + CALL_END).startswith(rest):
        return "open", ParsedCall(name, raw, stable=False), None
    return "bad", None, None
