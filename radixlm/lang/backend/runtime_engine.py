"""`Runtime`: the in-process backend, driving a `radixlm.runtime.engine.Engine` directly."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixlm.formats.tool_parsers import ToolCallParser, resolve_parser
from radixlm.lang.backend.base import (
    DEFAULT_TIMEOUT_S,
    Backend,
    BackendError,
    ChoiceLogprobs,
    Prompt,
    call_with_timeout,
    common_prefix_len,
    iter_with_timeout,
)
from radixlm.lang.chat_template import ChatTemplate

if TYPE_CHECKING:  # annotations only: gen_args reads global_config, which imports this
    from radixlm.lang.gen_args import GenArgs

DEFAULT_MODEL = "smollm2-135m-instruct"


def _check_finished(out: dict[str, Any]) -> dict[str, Any]:
    reason = out.get("meta_info", {}).get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise BackendError(f"request aborted: {reason.get('message')}")
    return out


class Runtime(Backend):
    """Backend over an in-process Engine.

    `Runtime(model="smollm2-135m-instruct", **engine_kwargs)` (or SGLang's `model_path=`)
    creates and owns an Engine (shut down by `shutdown()` or `with`); `Runtime(engine)` wraps
    an existing one. Calls taking longer than `timeout` seconds are aborted (BackendError).
    """

    def __init__(self, model: Any = DEFAULT_MODEL, timeout: float = DEFAULT_TIMEOUT_S, *,
                 model_path: str | None = None, **engine_kwargs: Any) -> None:
        if model_path is not None:  # SGLang's spelling
            model = model_path
        if isinstance(model, str):
            from radixlm.runtime.engine import Engine

            self.engine = Engine(model=model, **engine_kwargs)
            self._owns_engine = True
        else:
            if engine_kwargs:
                raise TypeError(f"engine options {sorted(engine_kwargs)} given with an existing "
                                "Engine")
            self.engine = model
            self._owns_engine = False
        self.timeout = timeout
        self._chat_template: ChatTemplate | None = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_tokenizer(self.engine.tokenizer)
        return self._chat_template

    def _call(self, what: str, samples: int = 1, **kwargs: Any) -> Any:
        """engine.generate(**kwargs) for one prompt (``samples`` of it: rids `rid-j`),
        aborted if it outlives the timeout."""
        rid = kwargs["rid"] = f"lang-{uuid.uuid4().hex}"
        rids = [rid] if samples == 1 else [f"{rid}-{j}" for j in range(samples)]
        return call_with_timeout(lambda: self.engine.generate(**kwargs), self.timeout, what,
                                 on_timeout=lambda: [self._abort(r) for r in rids])

    def _abort(self, rid: str | None) -> None:
        if rid is not None:
            try:
                self.engine.abort(rid)
            except Exception:  # best effort: the request may already be gone
                pass

    def generate(self, prompt: Prompt, params: GenArgs) -> tuple[Any, Any]:
        out = self._call("generate", samples=params.n or 1, prompt=prompt.text,
                         **params.wire_request())
        if isinstance(out, list):  # n > 1: one result per sample
            outs = [_check_finished(o) for o in out]
            return [o["text"] for o in outs], [o["meta_info"] for o in outs]
        out = _check_finished(out)
        return out["text"], out["meta_info"]

    def generate_stream(self, prompt: Prompt,
                        params: GenArgs) -> Iterator[tuple[str, dict[str, Any]]]:
        rid = f"lang-{uuid.uuid4().hex}"
        chunks = iter_with_timeout(
            lambda: self.engine.generate(prompt=prompt.text, **params.wire_request(),
                                         stream=True, rid=rid),
            self.timeout, "generate (stream)", on_timeout=lambda: self._abort(rid))
        sent = ""
        for chunk in chunks:
            _check_finished(chunk)
            text = chunk["text"]
            yield text[len(sent):], chunk["meta_info"]
            sent = text

    def choice_logprobs(self, prompt: str, choices: list[str]) -> list[ChoiceLogprobs]:
        """One batched prefill of prompt+choice_i; logprobs only from the first token where
        the tokenizations of the prompt and prompt+choice differ."""
        tok = self.engine.tokenizer
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        full_ids = [tok.encode(prompt + c, add_special_tokens=False) for c in choices]
        bounds = [common_prefix_len(prompt_ids, ids) for ids in full_ids]
        bounds = [min(b, len(ids) - 1) for b, ids in zip(bounds, full_ids, strict=True)]
        start = min(bounds)
        rids = [f"lang-{uuid.uuid4().hex}" for _ in choices]
        outs = call_with_timeout(
            lambda: self.engine.generate(input_ids=full_ids,
                                         sampling_params={"max_new_tokens": 0},
                                         return_logprob=True, logprob_start_len=start,
                                         return_text_in_logprobs=True, rid=rids),
            self.timeout, "select", on_timeout=lambda: [self._abort(r) for r in rids])
        return [ChoiceLogprobs(_check_finished(out)["meta_info"]["input_token_logprobs"],
                               ids[b:], out["meta_info"])
                for out, ids, b in zip(outs, full_ids, bounds, strict=True)]

    def unconditional_logprobs(self, token_ids: list[list[int]]) -> list[list]:
        outs = call_with_timeout(
            lambda: self.engine.generate(input_ids=token_ids,
                                         sampling_params={"max_new_tokens": 0},
                                         return_logprob=True, logprob_start_len=0),
            self.timeout, "select (unconditional)")
        return [o["meta_info"]["input_token_logprobs"] for o in outs]

    def cache_prefix(self, prefix: str) -> None:
        call_with_timeout(
            lambda: self.engine.generate(prompt=prefix, sampling_params={"max_new_tokens": 0}),
            self.timeout, "cache_prefix")

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def tool_parser(self) -> ToolCallParser:
        return resolve_parser(getattr(self.engine.config, "tool_call_parser", None),
                              getattr(self.engine.tokenizer, "chat_template", None))

    def token_ids(self, text: str) -> list[int]:
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    def check_grammar(self, grammar: str) -> None:
        from radixlm.constraints.specs import ConstraintSpec

        backend = getattr(self.engine, "grammar_backend", None)
        if backend is not None:
            backend.validate(ConstraintSpec("ebnf", grammar))

    def get_server_info(self) -> dict[str, Any]:
        return {"model_path": str(self.engine.model_path),
                "model_name": self.engine.model_name,
                **self.engine.get_stats()}

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
