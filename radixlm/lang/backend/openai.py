"""`OpenAI`: backend for any OpenAI-compatible server (the OpenAI API, `radixlm serve`, vLLM...).

Chat models get the program's messages: a `gen` must come right after an assistant role
begins (`s += sgl.assistant(sgl.gen("x"))`). Completion models (`is_chat_model=False`) get the
program's text. Constraints go out as `response_format` (json_schema) or SGLang's extra
`regex` field (regex, dtype). `select` scores choices from the logprobs of the first answer
token (chat) or from echoed prompt logprobs (completions) when the server returns them, and
otherwise matches a short greedy answer against the choices.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from radixlm.lang.backend.base import (
    DEFAULT_TIMEOUT_S,
    Backend,
    BackendError,
    ChoiceLogprobs,
    Prompt,
)
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.gen_args import GenArgs, constraint_regex

# Only used to show chat programs as text; the server applies the model's real template.
_DISPLAY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class OpenAI(Backend):
    """Backend over the OpenAI API shape (`openai` client)."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 is_chat_model: bool = True, timeout: float = DEFAULT_TIMEOUT_S,
                 chat_template: str | None = None) -> None:
        import openai

        self._openai = openai
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=timeout, max_retries=0)
        self.model = model
        self.is_chat_model = is_chat_model
        self.timeout = timeout
        self._chat_template = ChatTemplate(chat_template or _DISPLAY_TEMPLATE)

    def get_chat_template(self) -> ChatTemplate:
        return self._chat_template

    def _messages(self, prompt: Prompt) -> list[dict[str, str]]:
        if prompt.cur_role != "assistant" or prompt.role_content:
            raise BackendError("with a chat model, gen must come right after an assistant "
                               "role begins: s += sgl.assistant(sgl.gen(...))")
        return prompt.messages

    def _call(self, fn: Any, **kw: Any) -> Any:
        try:
            return fn(**kw)
        except self._openai.APITimeoutError as e:
            raise BackendError(f"OpenAI request timed out after {self.timeout:g} s") from e
        except self._openai.APIConnectionError as e:
            raise BackendError(f"cannot reach the OpenAI-compatible server: {e}") from e
        except self._openai.APIStatusError as e:
            raise BackendError(f"OpenAI request failed with HTTP {e.status_code}: "
                               f"{e.message}") from e

    def generate(self, prompt: Prompt, params: GenArgs) -> tuple[Any, Any]:
        wire = params.wire_request()
        kw = openai_request(self.model, wire)
        if self.is_chat_model:
            if wire.get("return_logprob"):
                kw["logprobs"] = True
                if wire.get("top_logprobs_num"):
                    kw["top_logprobs"] = wire["top_logprobs_num"]
            resp = self._call(self.client.chat.completions.create,
                              messages=self._messages(prompt), **kw)
            texts = [c.message.content or "" for c in resp.choices]
        else:
            if wire.get("return_logprob"):
                kw["logprobs"] = wire.get("top_logprobs_num") or 1
            resp = self._call(self.client.completions.create, prompt=prompt.text, **kw)
            texts = [c.text for c in resp.choices]
        metas = []
        for choice in resp.choices:
            meta: dict[str, Any] = {"id": resp.id, "finish_reason": choice.finish_reason}
            if resp.usage is not None:
                meta["prompt_tokens"] = resp.usage.prompt_tokens
                meta["completion_tokens"] = resp.usage.completion_tokens
            if getattr(choice, "logprobs", None) is not None:
                meta["logprobs"] = choice.logprobs.model_dump()
            metas.append(meta)
        if "n" in kw:  # n > 1: one text and meta per sample
            return texts, metas
        return texts[0], metas[0]

    def generate_stream(self, prompt: Prompt,
                        params: GenArgs) -> Iterator[tuple[str, dict[str, Any]]]:
        kw = openai_request(self.model, params.wire_request())
        if self.is_chat_model:
            stream = self._call(self.client.chat.completions.create,
                                messages=self._messages(prompt), stream=True, **kw)
        else:
            stream = self._call(self.client.completions.create, prompt=prompt.text,
                                stream=True, **kw)
        try:
            for chunk in stream:
                if not chunk.choices:
                    continue
                c = chunk.choices[0]
                piece = (c.delta.content or "") if self.is_chat_model else c.text
                yield piece, {"finish_reason": c.finish_reason}
        except self._openai.APIError as e:
            raise BackendError(f"OpenAI stream failed: {e}") from e

    def choice_logprobs(self, prompt: str, choices: list[str]) -> list[ChoiceLogprobs]:
        """Completion models: echo the prompt+choice with logprobs, one batched request (the
        entries' token ids are positions: the API returns token texts only)."""
        resp = self._call(self.client.completions.create, model=self.model,
                          prompt=[prompt + c for c in choices], max_tokens=0, echo=True,
                          logprobs=0, temperature=0)
        read = []
        for choice in resp.choices:
            lp = choice.logprobs
            if lp is None or not lp.tokens:
                raise BackendError("the server returned no echoed logprobs")
            read.append(ChoiceLogprobs(list(zip(lp.token_logprobs, range(len(lp.tokens)),
                                                lp.tokens, strict=True))))
        return read

    def select(self, prompt: Prompt, choices: list[str], temperature: float,
               method: ChoicesSamplingMethod) -> ChoicesDecision:
        if not self.is_chat_model and not method.requires_unconditional_logprobs:
            try:
                return super().select(prompt, choices, temperature, method)
            except BackendError:
                pass  # no echo support: fall through to the answer-matching path
        return self._select_by_answer(prompt, choices)

    def _select_by_answer(self, prompt: Prompt, choices: list[str]) -> ChoicesDecision:
        """Ask for a short greedy answer with first-token logprobs; score each choice by the
        logprob of a top first token that starts it, tie-broken by the answer's text."""
        params = GenArgs(max_new_tokens=16, temperature=0.0, return_logprob=True,
                                top_logprobs_num=20)
        try:
            text, meta = self.generate(prompt, params)
        except BackendError:
            params.return_logprob, params.top_logprobs_num = None, None
            text, meta = self.generate(prompt, params)
        first_top = _first_top_logprobs(meta.get("logprobs"))
        scores = []
        for c in choices:
            firsts = [lp for tok, lp in first_top.items() if tok.strip() and (
                c.startswith(tok.strip()) or tok.strip().startswith(c))]
            match = _common_prefix(text.strip(), c) / len(c)
            scores.append((max(firsts) if firsts else float("-inf"), match))
        best = max(range(len(choices)), key=lambda i: scores[i])
        return ChoicesDecision(choices[best], {"answer": text,
                                               "first_token_logprobs": first_top,
                                               "scores": scores})


# SGLang sampling parameters the OpenAI API takes under the same name, when set.
_OPENAI_FIELDS = ("temperature", "top_p", "frequency_penalty", "presence_penalty")


def openai_request(model: str, wire: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI request for a native request (`GenArgs.wire_request()`): OpenAI's own
    fields, SGLang's extras (`top_k`, `min_p`, `ignore_eos`, `regex`; a `dtype` as its regex)
    in `extra_body`, a JSON schema as `response_format`. Logprob options are the caller's."""
    sp = wire["sampling_params"]
    kw: dict[str, Any] = {"model": model, "max_tokens": sp.get("max_new_tokens")}
    kw.update({name: sp[name] for name in _OPENAI_FIELDS if name in sp})
    if sp.get("stop"):
        kw["stop"] = sp["stop"]
    if sp.get("stop_regex"):
        raise BackendError("stop_regex is not supported by the OpenAI backend")
    if "n" in sp:
        kw["n"] = sp["n"]
    extra: dict[str, Any] = {}
    if sp.get("top_k") is not None and sp["top_k"] > 0:
        extra["top_k"] = sp["top_k"]
    if sp.get("min_p"):
        extra["min_p"] = sp["min_p"]
    if sp.get("ignore_eos"):
        extra["ignore_eos"] = True
    if sp.get("thinking_budget") is not None:  # SGLang's field (a reasoning parser's)
        extra["thinking_budget"] = sp["thinking_budget"]
    if sp.get("complete_within_max_tokens") is not None:  # radixlm's field
        extra["complete_within_max_tokens"] = sp["complete_within_max_tokens"]
    if "json_schema" in sp:
        kw["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": json.loads(sp["json_schema"])}}
    elif constraint_regex(sp) is not None:
        extra["regex"] = constraint_regex(sp)
    if extra:
        kw["extra_body"] = extra
    return kw


def _first_top_logprobs(logprobs: Any) -> dict[str, float]:
    """{token text: logprob} of the first answer token (chat or legacy completions shape)."""
    try:
        if "content" in logprobs:  # chat
            first = logprobs["content"][0]
            return {t["token"]: t["logprob"] for t in first["top_logprobs"]} or {
                first["token"]: first["logprob"]}
        return dict(logprobs["top_logprobs"][0]) or {
            logprobs["tokens"][0]: logprobs["token_logprobs"][0]}
    except (TypeError, KeyError, IndexError):
        return {}


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
