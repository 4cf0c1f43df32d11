"""radixlm: structured-generation LLM serving with an SGLang-style frontend language.

`import radixlm as sgl` gives the language (function, gen, select, roles, backends). Heavy
parts (the Engine, torch) load only when first used.
"""

from typing import Any

from radixlm import envs as _envs

_envs.configure_openmp()  # before anything imports torch
_envs.cap_cpu_isa()

from radixlm.lang import (  # noqa: E402
    Backend,
    BackendError,
    ProgramError,
    ProgramState,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    global_config,
    greedy_token_selection,
    image,
    select,
    separate_reasoning,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
    video,
)

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("radixlm.runtime.engine", "Engine"),
    "Runtime": ("radixlm.lang.backend.runtime_engine", "Runtime"),
    "RuntimeEndpoint": ("radixlm.lang.backend.runtime_endpoint", "RuntimeEndpoint"),
    "OpenAI": ("radixlm.lang.backend.openai", "OpenAI"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")


__all__ = [
    "Backend", "BackendError", "Engine", "OpenAI", "ProgramError", "ProgramState", "Runtime",
    "RuntimeEndpoint", "assistant", "assistant_begin", "assistant_end", "flush_cache",
    "function", "gen", "gen_int", "gen_string", "get_default_backend", "get_server_info",
    "global_config", "greedy_token_selection", "image", "select", "separate_reasoning",
    "set_default_backend", "system", "system_begin",
    "system_end", "token_length_normalized", "unconditional_likelihood_normalized", "user",
    "user_begin", "user_end", "video",
]
