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
_CONTEXT_SYSTEM = "\x00RADIXLM_SYSTEM\x00"  # a context's system text must not leak into a segment
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
        def open_end(text: str) -> str:
            trailer = self.trailer
            return text[:len(text) - len(trailer)] if trailer and text.endswith(trailer) else text

        try:
            before = open_end(self.render(context)) if context else ""
            full = open_end(self.render(context + [{"role": role, "content": _SENTINEL}]))
        except Exception as e:
            raise ChatTemplateError(f"chat template cannot render role {role!r}: {e}") from e
        if not full.startswith(before) or full.count(_SENTINEL) != 1:
            raise ChatTemplateError(
                f"cannot isolate role {role!r} in the chat template: adding a message does "
                f"not extend the rendered text ({before[-40:]!r} vs {full[-60:]!r})")
        prefix, suffix = full[len(before):].split(_SENTINEL)
        return prefix, suffix

    @cached_property
    def trailer(self) -> str:
        """Text written after the last message of a chat without a generation prompt (Phi-3
        closes it with EOS), found by comparing a one- and a two-message chat."""
        user, reply = {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}
        try:
            one, two = self.render([user]), self.render([user, reply])
        except Exception:  # noqa: BLE001 - e.g. a template that wants a system message
            return ""
        if two.startswith(one):
            return ""
        # Text alone cannot tell "<|end|>\n<|" + "endoftext|>" from "<|end|>\n" +
        # "<|endoftext|>": a special token (EOS) that fits is the trailer.
        fits = [t for t in self.special_tokens.values()
                if one.endswith(t) and two.endswith(t) and two.startswith(one[:-len(t)])]
        if fits:
            return max(fits, key=len)
        for k in range(1, len(one) + 1):
            if two.startswith(one[:-k]) and two.endswith(one[-k:]):
                return one[-k:]
        return ""

    def segments(self, role: str) -> tuple[str, str]:
        """(prefix, suffix) written around a message of `role` in the middle of a chat."""
        if role not in _ROLES:
            raise ChatTemplateError(f"unknown role {role!r}; expected one of {_ROLES}")
        if role not in self._segments:
            sys_msg = {"role": "system", "content": _CONTEXT_SYSTEM}
            user_msg = {"role": "user", "content": "U"}
            reply = {"role": "assistant", "content": "A"}
            if role == "system":
                seg = self._tail([], "system")
                seg = (seg[0][len(self.leading_text):], seg[1])
            else:
                # After a system message first; after a user/assistant exchange where the
                # template rejects system messages (Gemma 2) or folds them into the first
                # user turn (Gemma 3: the system text would land in the user prefix).
                contexts = ([[sys_msg], [user_msg, reply]] if role == "user"
                            else [[sys_msg, user_msg], [user_msg]])
                seg = self._tail_in_context(contexts, role)
            self._segments[role] = seg
        return self._segments[role]

    def _tail_in_context(self, contexts: list[list[dict[str, str]]], role: str):
        """``_tail`` after the first context that renders ``role`` cleanly."""
        error = None
        for context in contexts:
            try:
                seg = self._tail(context, role)
            except ChatTemplateError as e:
                error = e
                continue
            if _CONTEXT_SYSTEM not in seg[0] + seg[1]:
                return seg
            error = ChatTemplateError(f"the chat template merges the system message into the "
                                      f"{role} message")
        raise error

    @cached_property
    def leading_text(self) -> str:
        """Text written once before the first message whatever its role (a BOS token)."""
        bos = self.special_tokens.get("bos_token") or ""
        if not bos or self.segments("user")[0].startswith(bos):
            return ""
        firsts = []
        for role in ("system", "user"):  # the roles a chat can start with (Gemma: user only)
            try:
                firsts.append(self._tail([], role)[0])
            except ChatTemplateError:
                continue
        return bos if firsts and all(f.startswith(bos) for f in firsts) else ""

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
        if not preamble:
            return None
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
