"""The Anthropic Messages API's conversation as chat messages (`conversation`), checked
block by block; errors name the Anthropic field (`messages.2.content.0.tool_use_id`).

- `system` (a string or text blocks) is the first system message; a `system` message in
  `messages` is one where it stands.
- A user message's text blocks are a user message (blocks joined by newlines); each
  `tool_result`, whose `tool_use_id` must name a `tool_use` block of the message before, is a
  `tool` message with its text (with `is_error`, after "Error: "), in block order.
- An assistant message's text is the content, its `tool_use` blocks the tool calls (input as
  JSON text), its `thinking` blocks the `reasoning_content`.
- Consecutive user (or assistant) turns are combined into one, as Anthropic does.
- A final assistant message is a prefill: the answer continues it (`continue_final_message`);
  an empty one is dropped.

Text, `tool_use`, `tool_result` and `thinking` blocks only: images, documents, search
results, redacted thinking and server-tool blocks are a 400 naming the block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.server.errors import AnthropicError

# per block type: its fields, and the required ones with their type (str ones non-empty
# but for `text`)
_FIELDS = {"text": {"text", "cache_control", "citations"},
           "tool_use": {"id", "name", "input", "cache_control", "caller"},
           "tool_result": {"tool_use_id", "content", "is_error", "cache_control"},
           "thinking": {"thinking", "signature"}}
_REQUIRED: dict[str, dict[str, type]] = {
    "text": {"text": str}, "tool_use": {"id": str, "name": str, "input": dict},
    "tool_result": {"tool_use_id": str}, "thinking": {"thinking": str, "signature": str}}
_MAY_BE_EMPTY = {"text", "thinking", "signature"}
_ROLE_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "thinking", "tool_use"),
                "system": ("text",)}


def bad(where: str, message: str) -> AnthropicError:
    """A 400 in Anthropic's shape naming the field ``where``."""
    return AnthropicError(400, f"{where}: {message}", param=where)


def cache_control(where: str, value: Any) -> None:
    """A `cache_control` breakpoint checked (400 naming ``where`` when malformed); it is
    otherwise inert: the radix cache keeps every prefix without being asked."""
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") != "ephemeral" \
            or set(value) - {"type", "ttl"} or value.get("ttl") not in (None, "5m", "1h"):
        raise bad(where, "must be {'type': 'ephemeral'} (with 'ttl' '5m' or '1h')")


def _block(where: str, block: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    """One content block checked: a type in ``allowed``, its fields, none unknown."""
    if not isinstance(block, dict):
        raise bad(where, "must be a content block object")
    kind = block.get("type")
    if not isinstance(kind, str) or kind not in allowed:
        raise bad(f"{where}.type", f"{kind!r} blocks are not supported by this server "
                  f"(here it takes {' / '.join(allowed)} blocks)")
    unknown = sorted(set(block) - _FIELDS[kind] - {"type"})
    if unknown:
        raise bad(f"{where}.{unknown[0]}", "Extra inputs are not permitted")
    for name, of in _REQUIRED[kind].items():
        value = block.get(name)
        if not isinstance(value, of) or (of is str and not value and name not in _MAY_BE_EMPTY):
            raise bad(f"{where}.{name}", f"required ({'a string' if of is str else 'an object'})")
    cache_control(f"{where}.cache_control", block.get("cache_control"))
    if block.get("citations"):
        raise bad(f"{where}.citations", "not supported by this server")
    if block.get("caller") not in (None, {"type": "direct"}):
        raise bad(f"{where}.caller", "only {'type': 'direct'} (this server runs no tools)")
    if not isinstance(block.get("is_error", False), bool):
        raise bad(f"{where}.is_error", "must be a boolean")
    return block


def blocks(where: str, content: Any, allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    """A content field (a string, or a list of blocks of the ``allowed`` types) as blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of content blocks")
    return [_block(f"{where}.{j}", b, allowed) for j, b in enumerate(content)]


def _text(parts: list[dict[str, Any]]) -> str:
    return "\n".join(p["text"] for p in parts if p["type"] == "text")


@dataclass
class Conversation:
    """The chat ``messages``, the Anthropic path each came from (``origins``, for errors),
    and whether the last is an assistant prefix the answer continues (``prefill``)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    prefill: bool = False

    def add(self, message: dict[str, Any], origin: str) -> None:
        """Append ``message``; a user or assistant turn right after one of its role is
        combined with it (texts joined by newlines, calls and thinking kept in order)."""
        last = self.messages[-1] if self.messages else None
        role = message["role"]
        if last is None or last["role"] != role or role not in ("user", "assistant"):
            self.messages.append(message)
            self.origins.append(origin)
            return
        texts = [t for t in (last["content"], message["content"]) if t]
        calls = [*last.get("tool_calls", []), *message.get("tool_calls", [])]
        last["content"] = "\n".join(texts) if texts or not calls else None
        if calls:
            last["tool_calls"] = calls
        thoughts = [t for t in (last.get("reasoning_content"), message.get("reasoning_content"))
                    if t]
        if thoughts:
            last["reasoning_content"] = "\n".join(thoughts)


def _result_text(where: str, block: dict[str, Any]) -> str:
    content = block.get("content")
    text = "" if content is None else _text(blocks(f"{where}.content", content, ("text",)))
    return f"Error: {text}" if block.get("is_error") else text


def _user(conv: Conversation, where: str, parts: list[dict[str, Any]],
          calls: set[str]) -> None:
    texts: list[str] = []
    for j, part in enumerate(parts):
        if part["type"] == "text":
            texts += [part["text"]] if part["text"] else []
            continue
        if texts:
            conv.add({"role": "user", "content": "\n".join(texts)}, where)
            texts = []
        at = f"{where}.content.{j}"
        if part["tool_use_id"] not in calls:
            raise bad(f"{at}.tool_use_id", f"{part['tool_use_id']!r} answers no tool_use block "
                      "of the previous (assistant) message")
        conv.add({"role": "tool", "tool_call_id": part["tool_use_id"],
                  "content": _result_text(at, part)}, where)
    if texts:
        conv.add({"role": "user", "content": "\n".join(texts)}, where)


def _assistant(conv: Conversation, where: str, parts: list[dict[str, Any]],
               last: bool) -> set[str]:
    """Add an assistant turn; returns its tool_use ids."""
    texts = [p["text"] for p in parts if p["type"] == "text"]
    calls = [{"id": p["id"], "type": "function", "function": {
        "name": p["name"], "arguments": json.dumps(p["input"], ensure_ascii=False)}}
        for p in parts if p["type"] == "tool_use"]
    thought = [p["thinking"] for p in parts if p["type"] == "thinking"]
    if last and (calls or not any(texts)):
        raise bad(f"{where}.content", "a final assistant message is a prefill the answer "
                  "continues: it takes text (and thinking) blocks, with some text")
    message: dict[str, Any] = {"role": "assistant",
                               "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thought:
        message["reasoning_content"] = "\n".join(thought)
    conv.add(message, where)
    conv.prefill = last
    return {c["id"] for c in calls}


def _message(where: str, m: Any) -> tuple[str, list[dict[str, Any]]]:
    """(role, blocks) of one entry of `messages`, checked."""
    if not isinstance(m, dict):
        raise bad(where, "must be a message object ({'role', 'content'})")
    unknown = sorted(set(m) - {"role", "content"})
    if unknown:
        raise bad(f"{where}.{unknown[0]}", "Extra inputs are not permitted")
    role = m.get("role")
    if not isinstance(role, str) or role not in _ROLE_BLOCKS:
        raise bad(f"{where}.role", f"{role!r} is not a role here (user, assistant or system)")
    if "content" not in m:
        raise bad(f"{where}.content", "Field required")
    return role, blocks(f"{where}.content", m["content"], _ROLE_BLOCKS[role])


def conversation(system: Any, messages: list[Any]) -> Conversation:
    """The request's `system` and `messages` as chat messages (see the module docstring);
    AnthropicError 400 naming the field it cannot take."""
    conv = Conversation()
    if system is not None:
        text = _text(blocks("system", system, ("text",)))
        if text:
            conv.add({"role": "system", "content": text}, "system")
    calls: set[str] = set()  # the tool_use ids of the assistant turn before
    prev = None
    for i, m in enumerate(messages):
        where, last = f"messages.{i}", i == len(messages) - 1
        role, parts = _message(where, m)
        if not any(p["type"] != "text" or p["text"] for p in parts):
            if role == "assistant" and last:
                break  # an empty final turn: nothing to continue
            raise bad(f"{where}.content", "must not be empty (only the final assistant "
                      "message may be)")
        if role == "assistant":
            ids = _assistant(conv, where, parts, last)
            calls = calls | ids if prev == "assistant" else ids
        elif role == "user":
            _user(conv, where, parts, calls)
            calls = set()
        else:
            conv.add({"role": "system", "content": _text(parts)}, where)
            calls = set()
        prev = role
    return conv
