"""The public primitives of the language: `function`, `gen`, `select`, roles, backends.

```python
import radixlm as sgl

@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=64))

sgl.set_default_backend(sgl.Runtime())          # in-process engine
state = qa.run(question="What is 2+2?", temperature=0)
print(state["answer"])
```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixlm.lang.backend.default import (  # the default backend lives there; public here
    as_backend,  # noqa: F401
    backend_or_default,
    get_default_backend,  # noqa: F401
    set_default_backend,  # noqa: F401
)
from radixlm.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.lang.gen_args import GenArgs
from radixlm.lang.ir import (
    Argument,
    Expr,
    ExprList,
    Gen,
    Media,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    to_expr,
)
from radixlm.lang.program import SglFunction
from radixlm.lang.reasoning import check_model_type


def function(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Decorator turning `def f(s, ...)` into a runnable program (`f.run`, `f.run_batch`)."""
    if func is None:
        return lambda f: SglFunction(f, **kwargs)
    return SglFunction(func, **kwargs)


def flush_cache(backend: Any = None) -> bool:
    """Empty the backend's prefix cache; False if it could not (requests running)."""
    return backend_or_default(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    return backend_or_default(backend).get_server_info()


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: Any = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    thinking_budget: int | None = None,
    complete_within_max_tokens: bool | None = None,
) -> Expr:
    """Generate text into variable `name`. Unset parameters take the run-level defaults.

    At most one constraint: `regex`, `json_schema` (dict, JSON string or pydantic model),
    `dtype` (int, float, bool, str), `choices` (which makes this a `select`) or `tools`
    (OpenAI's; with `tool_choice` "auto" / "required" / "none" / a named function and
    `parallel_tool_calls`, the output follows the backend's tool-call format, lang/tools.py,
    its calls parsed into `<name>_tool_calls` in OpenAI's shape; `name` keeps the text).
    `thinking_budget`: the most tokens a reasoning model may think before its answer (the
    reasoning parser enforces it). `complete_within_max_tokens`: a constrained output closes
    a valid document within `max_tokens`. Bad values raise ValueError here."""
    if _placeholder(max_tokens, min_tokens, stop, temperature, regex, json_schema, dtype,
                    choices):
        return Gen(name)  # tracing with placeholder arguments: the trace stops here anyway
    if name is not None and not isinstance(name, str):
        raise TypeError(f"gen: name must be a str, got {type(name).__name__}")
    _check_one_constraint(regex=regex, json_schema=json_schema, dtype=dtype, choices=choices,
                          tools=tools)
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0,
                      choices_method=choices_method or token_length_normalized)
    return Gen(name, GenArgs(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop,
        stop_token_ids=stop_token_ids, stop_regex=stop_regex, temperature=temperature,
        top_p=top_p, top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty, ignore_eos=ignore_eos, return_logprob=return_logprob,
        logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, dtype=dtype, regex=regex,
        json_schema=json_schema, tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls, thinking_budget=thinking_budget,
        complete_within_max_tokens=complete_within_max_tokens).checked())


def _check_one_constraint(**given: Any) -> None:
    constraints = [k for k, v in given.items() if v is not None]
    if len(constraints) > 1:
        raise ValueError(f"gen: at most one constraint allowed, got {constraints}")


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    """`gen` constrained to an integer."""
    return gen(name, dtype="int", **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    """`gen` constrained to a double-quoted string."""
    return gen(name, dtype="str", **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Expr:
    """Append the choice the model finds most likely (scored in one batched request)."""
    if _placeholder(choices, temperature):
        return Select(name, [], 0.0, choices_method)  # tracing: the trace stops here
    if not choices or not isinstance(choices, (list, tuple)):
        raise ValueError(f"select: choices must be a non-empty list of str, got {choices!r}")
    bad = [c for c in choices if not isinstance(c, str) or not c]
    if bad:
        raise ValueError(f"select: every choice must be a non-empty str, got {bad!r}")
    if not isinstance(choices_method, ChoicesSamplingMethod):
        raise TypeError("select: choices_method must be one of radixlm.lang.choices' methods")
    if temperature is None or temperature < 0:
        raise ValueError(f"select: temperature must be >= 0, got {temperature}")
    return Select(name, list(choices), float(temperature), choices_method)


def image(path: Any) -> Expr:
    """SGLang's image input. radixlm serves text-only models: appending it to a state raises
    ValueError ("this model has no vision input")."""
    return Media("image", path)


def video(path: Any, num_frames: int = 0) -> Expr:
    """SGLang's video input; like `image`, refused when appended (text-only models)."""
    return Media("video", path)


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Expr:
    """Run `expr` (a named gen/select, or a list of them), then split each variable's text
    into the answer (kept in the variable and the state's text) and the reasoning (in
    `<name>_reasoning_content`), by `model_type`'s markers (`qwen3`, `deepseek-r1`, ...).
    When streaming, the variables are split but the text already streamed is left as is."""
    check_model_type(model_type)
    if expr is None:
        raise ValueError("separate_reasoning: give the gen/select to split")
    return SeparateReasoning(model_type, to_expr(expr))  # type: ignore[arg-type]


def _placeholder(*values: Any) -> bool:
    """True while tracing when a parameter is (or holds) a program-argument placeholder."""
    return any(isinstance(v, Argument) or (isinstance(v, (list, tuple)) and
                                           any(isinstance(x, Argument) for x in v))
               for v in values)


def _role(role: str, expr: Any) -> Expr:
    inner = [] if expr is None else [to_expr(expr)]
    return ExprList([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Any = None) -> Expr:
    """A system message around `expr` (text and/or expressions)."""
    return _role("system", expr)


def user(expr: Any = None) -> Expr:
    return _role("user", expr)


def assistant(expr: Any = None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")
