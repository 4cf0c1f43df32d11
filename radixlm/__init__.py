"""radixlm: structured-generation LLM serving with an SGLang-style frontend language.

`import radixlm as sgl` gives the language (function, gen, select, roles, backends). Every
part loads when first used: the DSL (`radixlm.lang`) at the first of its names, the Engine
and torch at `sgl.Engine` / `sgl.Runtime`, so a runtime or server process that imports
`radixlm.runtime` or `radixlm.server` loads no DSL module.
"""

from typing import Any

from radixlm import envs as _envs

_envs.configure_openmp()  # before anything imports torch
_envs.cap_cpu_isa()

__version__ = "0.1.0"

# radixlm.lang.__all__, the names `import radixlm as sgl` gives (tests/test_structure.py
# keeps the two in step)
_LANG_NAMES = [
    "Backend", "BackendError", "ChatTemplate", "ChatTemplateError", "GlobalConfig",
    "ProgramError", "ProgramState", "ProgramStateGroup", "SglFunction", "assistant",
    "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int",
    "gen_string", "get_default_backend", "get_server_info", "global_config",
    "greedy_token_selection", "image", "select", "separate_reasoning", "set_default_backend",
    "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]

_LAZY = {
    "Engine": ("radixlm.runtime.engine", "Engine"),
    "Runtime": ("radixlm.lang.backend.runtime_engine", "Runtime"),
    "RuntimeEndpoint": ("radixlm.lang.backend.runtime_endpoint", "RuntimeEndpoint"),
    "OpenAI": ("radixlm.lang.backend.openai", "OpenAI"),
    **{name: ("radixlm.lang", name) for name in _LANG_NAMES},
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = list(_LAZY)
