"""The default backend: what a program runs on without `backend=`, and what counts as one.

`set_default_backend` / `global_config.default_backend` store it here; `run`, `run_batch`,
`flush_cache` and `get_server_info` ask `backend_or_default`. An in-process Engine is accepted
wherever a backend is (wrapped in a `Runtime` that does not own it).
"""

from __future__ import annotations

from typing import Any

from radixlm.lang.backend.base import Backend
from radixlm.lang.backend.runtime_engine import Runtime

_default_backend: Backend | None = None


def as_backend(backend: Any) -> Backend:
    """Accept a Backend, or an in-process Engine (wrapped in a Runtime that does not own it)."""
    if isinstance(backend, Backend):
        return backend
    if type(backend).__name__ == "Engine" and hasattr(backend, "generate"):
        return Runtime(backend)
    raise TypeError(f"not a backend: {type(backend).__name__} (use radixlm.Runtime, "
                    "RuntimeEndpoint, OpenAI or an Engine)")


def set_default_backend(backend: Any) -> None:
    """Backend used by programs run without `backend=`."""
    global _default_backend
    _default_backend = as_backend(backend)


def clear_default_backend() -> None:
    global _default_backend
    _default_backend = None


def get_default_backend() -> Backend | None:
    return _default_backend


def backend_or_default(backend: Any) -> Backend:
    """`backend` as a Backend, or the default one; RuntimeError when neither is there."""
    if backend is not None:
        return as_backend(backend)
    if _default_backend is None:
        raise RuntimeError("no backend: call radixlm.set_default_backend(...) or pass backend=")
    return _default_backend
