"""radixlm: structured-generation LLM serving with an SGLang-style frontend language.

`import radixlm as sgl` gives the language (function, gen, select, roles, backends). Heavy
parts (the Engine, torch) load only when first used.
"""

from typing import Any

from radixlm import envs as _envs

_envs.configure_openmp()  # before anything imports torch
_envs.cap_cpu_isa()

from radixlm.lang import *  # noqa: E402, F403 (the DSL: every name in radixlm.lang.__all__)
from radixlm.lang import __all__ as _LANG_NAMES  # noqa: E402

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


__all__ = [*_LANG_NAMES, *_LAZY]
