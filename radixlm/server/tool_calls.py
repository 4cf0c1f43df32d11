"""OpenAI tool calling for /v1/chat/completions over the formats of
`radixlm.formats.tool_parsers` (one per model family; the server's is `--tool-call-parser`,
else the one its chat template shows, else `qwen25`'s `<tool_call>` blocks).

Messages are checked as the OpenAI API checks them (`message_dicts`: 400 naming the
field). Prompt: a chat template that reads `tools` (its source mentions it) gets them, and
earlier calls and `role: "tool"` results, through `apply_chat_template(tools=...)`;
otherwise the format's documented system text lists the functions, earlier calls are
written back in the format's own call text and results as the format's result message.

Output (`tool_sampling`): "required" / named, the whole output is the format's calls with
arguments constrained by each function's `parameters` (exactly, additionalProperties
false, with `strict: true`); "auto", a structural tag: free text in which the format's
marker starts calls constrained the same way (llguidance; on the outlines backend "auto"
runs unconstrained and is parsed the same way, "required" / named are refused); "none":
no tools in the prompt, nothing parsed. Parsing back (`ToolSetup.parse`, `ToolCallStream`):
OpenAI `tool_calls`, text that is not a call stays content.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constraints.specs import ConstraintSpec
from radixlm.formats.tool_parsers import ToolCallParser, ToolSetup, parse_tools, resolve_parser
from radixlm.formats.tool_parsers.grammar import check_functions, token_lookup, tool_sampling
from radixlm.server.protocol import ChatMessage

# extra (non-schema) message fields OpenAI takes, per role; all go to the chat template
_EXTRA_FIELDS = {"assistant": ("tool_calls", "reasoning_content", "refusal"),
                 "tool": ("tool_call_id",)}


class MessageError(ValueError):
    """A message that breaks the OpenAI API's rules; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def server_parser(engine: Any) -> ToolCallParser:
    """The engine's tool-call format: its ``tool_call_parser``, else its template's."""
    config = getattr(engine, "config", None)
    return resolve_parser(getattr(config, "tool_call_parser", None),
                          getattr(engine.tokenizer, "chat_template", None))


def request_tools(engine: Any, tools: Any, tool_choice: Any,
                  parallel_tool_calls: Any) -> ToolSetup | None:
    """A request's tool fields checked in the engine's format (ValueError naming the
    problem)."""
    return parse_tools(tools, tool_choice, parallel_tool_calls, server_parser(engine))


def template_reads_tools(tokenizer: Any) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


# -------------------------------------------------------------------------- messages

def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them, checked as OpenAI does:
    content is required but for an assistant turn with tool calls; a tool result needs
    `tool_call_id`; a call's `arguments` is a JSON string; other fields are errors."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        extra = dict(m.model_extra or {})
        allowed = _EXTRA_FIELDS.get(m.role, ())
        unknown = sorted(k for k in extra if k not in allowed)
        if unknown:
            raise MessageError(f"{where}.{unknown[0]} is not a field of a {m.role!r} message",
                               f"{where}.{unknown[0]}")
        calls = extra.get("tool_calls")
        if m.content is None and not (m.role == "assistant" and calls):
            raise MessageError(f"{where}.content is required for role {m.role!r}"
                               + (" (unless it has tool_calls)" if m.role == "assistant"
                                  else ""), f"{where}.content")
        try:
            text = m.text()
        except ValueError as exc:
            raise MessageError(f"{where}.content: {exc}", f"{where}.content") from None
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                             "content": text, **({"name": m.name} if m.name else {})}
        if m.role == "tool":
            tid = extra.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise MessageError(f"{where}.tool_call_id is required for role 'tool' (the "
                                   "id of the call this answers)", f"{where}.tool_call_id")
            d["tool_call_id"] = tid
        if calls is not None:
            d["tool_calls"] = _checked_calls(where, calls)
        for key in ("reasoning_content", "refusal"):
            if extra.get(key) is not None:
                if not isinstance(extra[key], str):
                    raise MessageError(f"{where}.{key} must be a string", f"{where}.{key}")
                d[key] = extra[key]
        out.append(d)
    return out


def _checked_calls(where: str, calls: Any) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls`, each {"id", "type": "function", "function":
    {"name", "arguments": JSON text of an object}}."""
    if not isinstance(calls, list) or not calls:
        raise MessageError(f"{where}.tool_calls must be a non-empty list", f"{where}.tool_calls")
    out = []
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(c, dict) or set(c) - {"id", "type", "function"}:
            raise MessageError(f"{at} must be {{'id', 'type': 'function', 'function'}}", at)
        if not isinstance(c.get("id"), str) or not c["id"]:
            raise MessageError(f"{at}.id is required (a string)", f"{at}.id")
        if c.get("type") != "function":
            raise MessageError(f"{at}.type must be 'function'", f"{at}.type")
        if not isinstance(fn, dict) or set(fn) - {"name", "arguments"} \
                or not isinstance(fn.get("name"), str):
            raise MessageError(f"{at}.function must be {{'name', 'arguments'}}",
                               f"{at}.function")
        args = fn.get("arguments")
        try:
            ok = isinstance(args, str) and isinstance(json.loads(args), dict)
        except ValueError:
            ok = False
        if not ok:
            raise MessageError(f"{at}.function.arguments must be a JSON string of an object, "
                               f"got {args!r:.80}", f"{at}.function.arguments")
        out.append({"id": c["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def render_messages(messages: list[dict[str, Any]], parser: ToolCallParser,
                    setup: ToolSetup | None, native: bool) -> list[dict[str, Any]]:
    """Messages for the chat template. ``native``: the template renders tools, calls and
    results itself (calls' arguments become objects, as templates expect); otherwise they
    are written in ``parser``'s format and its system text lists the functions."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if native:
            if calls:
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                    c["function"]["arguments"])}} for c in calls]
            out.append(m)
            continue
        m.pop("tool_call_id", None)
        if calls:
            text = parser.calls_text([(c["function"]["name"], c["function"]["arguments"])
                                      for c in calls])
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + [text])
        out.append(parser.result_message(m.get("content") or "") if m["role"] == "tool"
                   else m)
    if setup is not None and setup.active and not native:
        prompt = parser.tools_prompt(setup.functions)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


# ---------------------------------------------------------------------------- output

def request_sampling(engine: Any, setup: ToolSetup,
                     skip_special_tokens: bool | None) -> tuple[dict[str, Any], bool]:
    """(sampling params, constrained) for an active ``setup`` on ``engine``: the format's
    grammar, each function's arguments checked to compile first (ValueError naming the
    function), and `skip_special_tokens` false unless the request set it."""
    config = getattr(engine, "config", None)
    whitespace = getattr(config, "json_whitespace", None)
    if getattr(config, "grammar_backend", "llguidance") == "outlines":
        if setup.whole_output_is_call:
            raise ValueError(f"tool_choice {setup.choice!r} needs the llguidance grammar "
                             "backend (this server runs --grammar-backend outlines)")
        return {}, False  # auto: unconstrained, parsed the same way
    backend = getattr(engine, "grammar_backend", None)
    if backend is not None:
        check_functions(setup, lambda lark: backend.validate(ConstraintSpec("ebnf", lark)),
                        whitespace)
    tok = engine.tokenizer
    sampling = tool_sampling(setup, token_lookup(
        lambda t: tok.encode(t, add_special_tokens=False)), whitespace)
    if skip_special_tokens is not None:
        sampling.pop("skip_special_tokens", None)
    return sampling, True


def finish_reason(finish: str | None, called: bool) -> str | None:
    """OpenAI's finish reason: "tool_calls" for an output that stopped after calls."""
    return "tool_calls" if called and finish == "stop" else finish
