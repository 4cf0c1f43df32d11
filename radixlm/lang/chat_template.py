"""Role segments of a model's own chat template (a Jinja string, as transformers stores it).

A program writes roles as begin/end markers around free text, so the interpreter needs each
role's prefix and suffix rather than a rendered conversation. They are found by rendering a
message whose content is a sentinel and splitting at it; the text a template puts before the
first message when it is not a system message (SmolLM2's default system prompt) is found the
same way. The template is rendered with the same Jinja settings as transformers, so the prompt
text is the one `tokenizer.apply_chat_template` would produce.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from typing import Any

_SENTINEL = "\x00RADIXLM_SENTINEL\x00"
_ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """The template cannot be used to render the requested role."""


def _compile(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTemplate:
    """A chat template and the role segments derived from it.

    `special_tokens` are the variables the template may read (`bos_token`, `eos_token`, ...).
    """

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        if not source or not isinstance(source, str):
            raise ChatTemplateError("empty chat template")
        self.source = source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._template = _compile(source)
        self._segments: dict[str, tuple[str, str]] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """Build from a transformers tokenizer (its `chat_template` and special tokens)."""
        source = getattr(tokenizer, "chat_template", None)
        if not source:
            raise ChatTemplateError(f"tokenizer {type(tokenizer).__name__} has no chat template")
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        return cls(source, {n: getattr(tokenizer, n, None) for n in names})

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """Render a conversation exactly as `tokenizer.apply_chat_template(tokenize=False)`."""
        return self._template.render(messages=messages,
                                     add_generation_prompt=add_generation_prompt,
                                     **self.special_tokens)

    def _tail(self, context: list[dict[str, str]], role: str) -> tuple[str, str]:
        """Prefix and suffix that `role` adds after `context` (found with a sentinel)."""
        try:
            before = self.render(context) if context else ""
            full = self.render(context + [{"role": role, "content": _SENTINEL}])
        except Exception as e:
            raise ChatTemplateError(f"chat template cannot render role {role!r}: {e}") from e
        if not full.startswith(before) or full.count(_SENTINEL) != 1:
            raise ChatTemplateError(
                f"cannot isolate role {role!r} in the chat template: adding a message does "
                f"not extend the rendered text ({before[-40:]!r} vs {full[-60:]!r})")
        prefix, suffix = full[len(before):].split(_SENTINEL)
        return prefix, suffix

    def segments(self, role: str) -> tuple[str, str]:
        """(prefix, suffix) written around a message of `role` in the middle of a chat."""
        if role not in _ROLES:
            raise ChatTemplateError(f"unknown role {role!r}; expected one of {_ROLES}")
        if role not in self._segments:
            sys_msg = {"role": "system", "content": "S"}
            if role == "system":
                seg = self._tail([], "system")
                seg = (seg[0][len(self.leading_text):], seg[1])
            elif role == "user":
                seg = self._tail([sys_msg], "user")
            else:
                seg = self._tail([sys_msg, {"role": "user", "content": "U"}], "assistant")
            self._segments[role] = seg
        return self._segments[role]

    @cached_property
    def leading_text(self) -> str:
        """Text written once before the first message whatever its role (a BOS token)."""
        bos = self.special_tokens.get("bos_token") or ""
        if not bos or self.segments("user")[0].startswith(bos):
            return ""
        try:
            firsts = [self._tail([], role)[0] for role in ("system", "user")]
        except ChatTemplateError:
            return ""
        return bos if all(f.startswith(bos) for f in firsts) else ""

    @cached_property
    def preamble(self) -> str:
        """What the template writes before a first message that is not a system message."""
        first_user = self._tail([], "user")[0][len(self.leading_text):]
        user_prefix = self.segments("user")[0]
        if not first_user.endswith(user_prefix):
            raise ChatTemplateError("cannot isolate the text before the first user message")
        return first_user[: len(first_user) - len(user_prefix)]

    @cached_property
    def default_system_prompt(self) -> str | None:
        """Content of the system message the template adds when a chat starts without one."""
        preamble = self.preamble
        sys_prefix, sys_suffix = self.segments("system")
        if preamble and preamble.startswith(sys_prefix) and preamble.endswith(sys_suffix):
            return preamble[len(sys_prefix): len(preamble) - len(sys_suffix)]
        return None

    def begin_text(self, role: str, first_message: bool) -> str:
        """Text to write at a role's start; the first message also gets the leading text."""
        prefix = self.segments(role)[0]
        return (self.leading_text + prefix) if first_message else prefix

    def end_text(self, role: str) -> str:
        return self.segments(role)[1]
