"""OpenAI tool calling for /v1/chat/completions: check `tools` / `tool_choice`, render them into
the prompt, constrain the output, and parse tool calls back out.

Prompt. A chat template that reads `tools` (its source mentions it) gets them through
`apply_chat_template(tools=...)`. Otherwise the generic format: a system message (prepended
to the first system message, if any) lists the functions as JSON and asks for calls as

    <tool_call>
    {"name": "<function name>", "arguments": {<arguments>}}
    </tool_call>

Assistant turns that carried `tool_calls` are rendered back in that form, and `role: "tool"`
results as a user turn `<tool_response>{content}</tool_response>` (any template can show it).

Output. `tool_choice` "required" or a named function: the whole output is JSON constrained by
a schema built from the functions' `parameters` (`{"name", "arguments"}`; a non-empty array of
them when `parallel_tool_calls` is not false and the choice is "required"), so arguments
validate. "auto" (the default with tools): SGLang's structural tag, free text in which
`<tool_call>` starts a segment whose body is constrained the same way (llguidance backend;
on the outlines backend "auto" runs unconstrained and the text is parsed the same way).
"none": tools are not rendered and nothing is parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass
class ToolSetup:
    """What a request's `tools` / `tool_choice` / `parallel_tool_calls` mean for one call."""

    functions: list[dict[str, Any]]  # [{"name", "description"?, "parameters"}]
    choice: str  # "none" | "auto" | "required" | "named"
    parallel: bool = True
    named: str | None = None
    openai_tools: list[dict[str, Any]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.choice != "none" and bool(self.functions)

    @property
    def whole_output_is_json(self) -> bool:
        return self.choice in ("required", "named")


def parse_tools(tools: list[dict[str, Any]] | None, tool_choice: Any,
                parallel_tool_calls: bool | None) -> ToolSetup | None:
    """Validate the request's tool fields (ValueError naming the problem; the API answers 400).
    None when the request has no tools and no tool_choice."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ValueError("'tool_choice' needs 'tools'")
        if tools is not None:
            raise ValueError("'tools' must not be empty")
        return None
    functions: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        functions.append(_parse_function(f"tools[{i}]", tool, functions))
    choice, named = _parse_tool_choice(tool_choice, functions)
    return ToolSetup(functions, choice, parallel_tool_calls is not False, named, list(tools))


def _parse_function(where: str, tool: Any, functions: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry of `tools` (at `where`) as {"name", "parameters", "description"?}; the
    name must not be among `functions`, the ones before it."""
    from radixlm.constraints.schema import check_schema

    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ValueError(f"{where}.type must be 'function'")
    extra = sorted(set(tool) - {"type", "function"})
    if extra:
        raise ValueError(f"{where}: unknown field(s) {extra}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be an object")
    unknown = set(fn) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise ValueError(f"{where}.function: unknown field(s) {sorted(unknown)}")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{where}.function.name must match ^[A-Za-z0-9_-]{{1,64}}$, "
                         f"got {name!r}")
    if any(f["name"] == name for f in functions):
        raise ValueError(f"{where}.function.name {name!r} is given twice")
    if "description" in fn and not isinstance(fn["description"], str):
        raise ValueError(f"{where}.function.description must be a string")
    if "strict" in fn and not isinstance(fn["strict"], bool | type(None)):
        raise ValueError(f"{where}.function.strict must be a bool")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ValueError(f"{where}.function.parameters must be a JSON schema object")
    try:
        check_schema(params)
    except ValueError as exc:
        raise ValueError(f"{where}.function.parameters: {exc}") from None
    return {"name": name, "parameters": params,
            **({"description": fn["description"]} if fn.get("description") else {})}


def _parse_tool_choice(tool_choice: Any,
                       functions: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(choice, named function or None) of `tool_choice` over the parsed `functions`."""
    if tool_choice is None or tool_choice == "auto":
        return "auto", None
    if tool_choice in ("none", "required"):
        return tool_choice, None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if (tool_choice.get("type") != "function" or not isinstance(fn, dict)
                or set(tool_choice) - {"type", "function"} or set(fn) - {"name"}):
            raise ValueError("'tool_choice' must be 'none', 'auto', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}")
        named = fn.get("name")
        if named not in [f["name"] for f in functions]:
            raise ValueError(f"'tool_choice' names function {named!r}, which is not in 'tools'")
        return "named", named
    raise ValueError(f"'tool_choice' must be 'none', 'auto', 'required' or a named "
                     f"function, got {tool_choice!r}")


# ------------------------------------------------------------------------------- prompt

def template_reads_tools(tokenizer) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def generic_tools_prompt(functions: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps({"type": "function", "function": f}, ensure_ascii=False)
                        for f in functions)
    return ("You can call functions. Available functions:\n" + listing + "\n\nTo call a "
            "function, reply with one block per call, exactly in this form:\n" + OPEN
            + '\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n' + CLOSE
            + "\nOtherwise answer normally.")


def render_messages(messages: list[dict[str, Any]], setup: ToolSetup | None,
                    native: bool) -> list[dict[str, Any]]:
    """Messages for the chat template. ``native``: the template reads `tools` itself, so
    only assistant `tool_calls` get their arguments as objects (what templates expect)."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if m["role"] == "assistant" and calls:
            if native:
                m["tool_calls"] = [{"type": "function", "function": {
                    "name": c["function"]["name"],
                    "arguments": _loads_args(c["function"].get("arguments"))}} for c in calls]
            else:
                blocks = [OPEN + "\n" + json.dumps(
                    {"name": c["function"]["name"],
                     "arguments": _loads_args(c["function"].get("arguments"))},
                    ensure_ascii=False) + "\n" + CLOSE for c in calls]
                m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        if not native:
            m.pop("tool_call_id", None)
            if m["role"] == "tool":
                m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n"
                                                "</tool_response>"}
        out.append(m)
    if setup is not None and setup.active and not native:
        prompt = generic_tools_prompt(setup.functions)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _loads_args(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            raise ValueError("assistant tool_calls arguments must be a JSON object string") \
                from None
    return args if args is not None else {}


# ---------------------------------------------------------------------------- constraint

def _call_schema(fn: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                             "arguments": fn["parameters"]},
            "required": ["name", "arguments"], "additionalProperties": False}


def constraint(setup: ToolSetup) -> dict[str, Any]:
    """Sampling-param constraint for the request (empty for "none")."""
    if not setup.active:
        return {}
    fns = setup.functions
    if setup.choice == "named":
        fns = [f for f in fns if f["name"] == setup.named]
    one = _call_schema(fns[0]) if len(fns) == 1 else {"anyOf": [_call_schema(f) for f in fns]}
    if setup.choice == "named" or (setup.choice == "required" and not setup.parallel):
        return {"json_schema": json.dumps(one)}
    if setup.choice == "required":
        return {"json_schema": json.dumps({"type": "array", "items": one, "minItems": 1})}
    return {"structural_tag": json.dumps({
        "structures": [{"begin": f'{OPEN}\n{{"name": "{f["name"]}", "arguments": ',
                        "schema": f["parameters"], "end": f"}}\n{CLOSE}"} for f in fns],
        "triggers": [OPEN]})}


# ------------------------------------------------------------------------------- parsing

def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _as_call(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return {"id": new_call_id(), "type": "function",
            "function": {"name": obj["name"],
                         "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_output(text: str, setup: ToolSetup) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a finished output. Text that does not parse stays content."""
    if not setup.active:
        return text, []
    if setup.whole_output_is_json:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        items = value if isinstance(value, list) else [value]
        calls = [c for c in (_as_call(v) for v in items) if c is not None]
        return (None, calls) if calls and len(calls) == len(items) else (text, [])
    calls, kept, pos = [], [], 0
    for m in _CALL_BLOCK.finditer(text):
        try:
            call = _as_call(json.loads(m.group(1)))
        except json.JSONDecodeError:
            call = None
        if call is None:
            continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append(call)
    if not calls:
        return text, []
    if not setup.parallel:
        calls = calls[:1]
    content = ("".join(kept) + text[pos:]).strip()
    return content or None, calls


def streamable_prefix(text: str, setup: ToolSetup) -> int:
    """How much of a growing output can be streamed as content now: nothing when the whole
    output is a call; else up to a `<tool_call>` (or a partial one at the end)."""
    if not setup.active:
        return len(text)
    if setup.whole_output_is_json:
        return 0
    at = text.find(OPEN)
    if at >= 0:
        return at
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return len(text) - k
    return len(text)
