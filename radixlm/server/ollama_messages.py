"""The Ollama API's messages as chat messages (`chat_messages`), one for one and in order (so
the chat rules' `messages[i]` is the Ollama message i), and tool calls back in Ollama's
shape (`ollama_call`); errors name the Ollama field (`messages[2].tool_calls[0].function`).

- `system`, `user`, `assistant` and `tool` messages; `content` a string (absent: "", or
  none for an assistant turn with calls).
- An assistant's `thinking` is its `reasoning_content`; its `tool_calls` (`{"function":
  {"name", "arguments": {...}}}`, arguments an object) are chat calls, with the `id` given or
  `call_<i>_<j>`.
- A `tool` message answers a call of the assistant turn before it: the first unanswered
  one named `tool_name` when given, else the first unanswered one.
- `images` are a 400 (the model takes text only), as is any field Ollama does not have.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.server.errors import OllamaError

_ROLES = ("system", "user", "assistant", "tool")
_FIELDS = {"role", "content", "thinking", "images", "tool_calls", "tool_name"}


def bad(where: str, message: str) -> OllamaError:
    """A 400 in Ollama's shape naming the field ``where``."""
    return OllamaError(400, f"{where}: {message}", param=where)


def _calls(where: str, calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as chat calls (arguments as JSON text)."""
    if not isinstance(calls, list) or not calls:
        raise bad(where, "must be a non-empty list of calls")
    out = []
    for j, c in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(c, dict) or set(c) - {"id", "type", "function"}:
            raise bad(at, "must be {'function': {'name', 'arguments'}} (and 'id')")
        fn = c.get("function")
        if not isinstance(fn, dict) or set(fn) - {"name", "arguments", "index"} \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"{at}.function", "must be {'name', 'arguments'} with a name")
        args = fn.get("arguments", {})
        if not isinstance(args, dict):
            raise bad(f"{at}.function.arguments", "must be an object")
        cid = c.get("id") or f"call_{i}_{j}"
        if not isinstance(cid, str):
            raise bad(f"{at}.id", "must be a string")
        out.append({"id": cid, "type": "function", "function": {
            "name": fn["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
    return out


def _answered(where: str, m: dict[str, Any], open_calls: list[tuple[str, str]],
              i: int) -> str:
    """The id of the call a tool message answers (taken off ``open_calls``)."""
    name = m.get("tool_name")
    if name is not None and not isinstance(name, str):
        raise bad(f"{where}.tool_name", "must be a string")
    for k, (cid, fn) in enumerate(open_calls):
        if name is None or fn == name:
            del open_calls[k]
            return cid
    return f"call_result_{i}"  # a result no call of the turn before names: rendered as is


def _message(where: str, m: Any, i: int,
             open_calls: list[tuple[str, str]]) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise bad(where, "must be a message object ({'role', 'content'})")
    unknown = sorted(set(m) - _FIELDS)
    if unknown:
        raise bad(f"{where}.{unknown[0]}", "not a field of an Ollama message")
    role = m.get("role")
    if role not in _ROLES:
        raise bad(f"{where}.role", f"{role!r} is not a role (system, user, assistant or tool)")
    if m.get("images"):
        raise bad(f"{where}.images", "not supported by this server (the model takes text "
                  "only)")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise bad(f"{where}.content", "must be a string")
    out: dict[str, Any] = {"role": role, "content": content or ""}
    for name in ("thinking", "tool_calls", "tool_name"):
        allowed = {"thinking": "assistant", "tool_calls": "assistant", "tool_name": "tool"}
        if m.get(name) is not None and role != allowed[name]:
            raise bad(f"{where}.{name}", f"only a {allowed[name]!r} message has it")
    if m.get("thinking") is not None:
        if not isinstance(m["thinking"], str):
            raise bad(f"{where}.thinking", "must be a string")
        out["reasoning_content"] = m["thinking"]
    if m.get("tool_calls") is not None:
        out["tool_calls"] = _calls(f"{where}.tool_calls", m["tool_calls"], i)
        out["content"] = content or None
        open_calls[:] = [(c["id"], c["function"]["name"]) for c in out["tool_calls"]]
    elif role == "tool":
        out["tool_call_id"] = _answered(where, m, open_calls, i)
    else:
        open_calls.clear()
    return out


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The request's `messages` as chat messages (see the module docstring)."""
    open_calls: list[tuple[str, str]] = []  # (id, name) of the turn before, unanswered
    return [_message(f"messages[{i}]", m, i, open_calls) for i, m in enumerate(messages)]


def ollama_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    """An OpenAI tool call of the output (arguments as JSON text) in Ollama's shape
    (arguments an object; text that is not an object, as a call cut short by the token
    limit, is {})."""
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = {}
    return {"id": call.get("id", ""), "function": {
        "index": index, "name": fn.get("name", ""),
        "arguments": args if isinstance(args, dict) else {}}}
