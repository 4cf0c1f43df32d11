"""``mistral``: Mistral v0.3 / Nemo calls, one JSON array after the ``[TOOL_CALLS]`` token,

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {...}]

The array is read whole: one that does not close or does not hold call objects is content.
Call ids are 9 alphanumeric characters, the only ids Mistral's chat templates accept back."""

from __future__ import annotations

import json
import random
import string
from typing import Any

from radixlm.formats.tool_parsers import base
from radixlm.formats.tool_parsers.text import ParsedCall, read_call, skip_ws

TAG = "[TOOL_CALLS]"
_ID_CHARS = string.ascii_letters + string.digits
_rng = random.SystemRandom()


class MistralParser(base.ToolCallParser):
    """``[TOOL_CALLS] [`` call objects ``]``."""

    name = "mistral"
    opener = TAG
    markers = (TAG,)

    def section(self, text: str, start: int, final: bool, names: frozenset[str]) -> base.Section:
        i = skip_ws(text, start + len(TAG))
        if i == len(text):
            return base.BAD_OPEN if final else base.Section([], None)
        if text[i] != "[":
            return base.BAD_OPEN
        calls: list[ParsedCall] = []
        k = skip_ws(text, i + 1)
        while k < len(text):
            if text[k] == "]" and calls:
                return base.Section(calls, k + 1)
            status, call, end = read_call(text, k, final)
            if status == "open" and (call is None or call.name in names):
                return base.Section(_unstable(calls + ([call] if call is not None else [])), None)
            if status != "done" or call is None or call.name not in names:
                return base.BAD_OPEN
            calls.append(call)
            k = skip_ws(text, end)  # type: ignore[arg-type]
            if k < len(text) and text[k] == ",":
                k = skip_ws(text, k + 1)
            elif k < len(text) and text[k] != "]":
                return base.BAD_OPEN
        return base.BAD_OPEN if final else base.Section(_unstable(calls), None)

    def tools_prompt(self, functions: list[dict[str, Any]]) -> str:
        listing = json.dumps([{"type": "function", "function": base.public_function(f)}
                              for f in functions], ensure_ascii=False)
        return (f"[AVAILABLE_TOOLS] {listing}[/AVAILABLE_TOOLS]\nTo call functions, answer "
                f'with {TAG} [{{"name": <function name>, "arguments": <arguments as a JSON '
                "object>}, ...] and nothing else.")

    def calls_text(self, calls: list[tuple[str, str]]) -> str:
        return f"{TAG} [" + ", ".join(base.call_json_text(n, a) for n, a in calls) + "]"

    def result_message(self, content: str) -> dict[str, str]:
        body = json.dumps({"content": content}, ensure_ascii=False)
        return {"role": "user", "content": f"[TOOL_RESULTS] {body}[/TOOL_RESULTS]"}

    def new_call_id(self) -> str:
        return "".join(_rng.choice(_ID_CHARS) for _ in range(9))

    def call_rules(self, fns: list[dict[str, Any]], g: Any) -> list[str]:
        return [f"call_{k}: {base.json_call(g, k, f['name'])}" for k, f in enumerate(fns)]

    def required_rule(self, g: Any, many: bool) -> str:
        return f'{g.marker(TAG)} " [" {base.calls_rule(many, ", ")} "]"'

    def auto_segments(self, fns: list[dict[str, Any]], g: Any,
                      many: bool) -> list[tuple[str, str]]:
        return [(TAG, f'" [" {base.calls_rule(many, ", ")} "]"')]


def _unstable(calls: list[ParsedCall]) -> list[ParsedCall]:
    for c in calls:
        c.stable = False
    return calls
