"""`SglFunction`: a decorated program and the ways to run it (run, run_batch, bind)."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from radixlm.lang.backend.base import BackendError
from radixlm.lang.backend.default import backend_or_default
from radixlm.lang.gen_args import GenArgs, normalize_dtype
from radixlm.lang.global_config import global_config
from radixlm.lang.state import ProgramState, run_program
from radixlm.lang.tracer import MIN_PREFIX_CHARS, TracerState, extract_prefix

logger = logging.getLogger(__name__)


class SglFunction:
    """A program `f(s, *args)`. Call `run`/`run_batch`; calling it with a ProgramState as
    first argument runs it inline on that state (programs compose)."""

    def __init__(self, func: Callable[..., Any], bind_arguments: dict[str, Any] | None = None,
                 **_: Any) -> None:
        if not callable(func):
            raise TypeError(f"radixlm.function needs a function, got {type(func).__name__}")
        self.func = func
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if not params or params[0].kind not in positional:
            raise TypeError(
                f"program {func.__name__!r}: the first parameter must be the program state "
                "(def f(s, ...))")
        self.arg_names = [p.name for p in params[1:]
                          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self.bind_arguments = dict(bind_arguments or {})
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy with some arguments fixed."""
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{self.__name__}.bind: unknown arguments {unknown}")
        return SglFunction(self.func, bind_arguments={**self.bind_arguments, **kwargs})

    def _arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        merged = {**self.bind_arguments, **kwargs}
        try:
            bound = self.signature.bind(None, *args, **merged)
        except TypeError as e:
            raise TypeError(f"{self.__name__}(): {e}") from None
        out = dict(bound.arguments)
        out.pop(next(iter(self.signature.parameters)))
        return out

    def _call_kwargs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Positional/keyword split that `func(state, ...)` accepts (handles *args)."""
        bound = self.signature.bind(None, *args, **{**self.bind_arguments, **kwargs})
        return tuple(bound.args[1:]), dict(bound.kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], (ProgramState, TracerState)):
            state = args[0]
            call_args, call_kwargs = self._call_kwargs(args[1:], kwargs)
            return self.func(state, *call_args, **call_kwargs)
        return self.run(*args, **kwargs)

    def run(self, *args: Any, max_new_tokens: int = 128, min_new_tokens: int | None = None,
            stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
            temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
            frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
            ignore_eos: bool = False, return_logprob: bool | None = None,
            logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
            return_text_in_logprobs: bool | None = None, dtype: Any = None,
            stream: bool = False, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run once. Sampling arguments are defaults for every gen that does not set them.

        With `stream=True` returns at once; read it with `state.text_iter()`. Failures of
        backend calls are in `state.error()`; errors in the program's own code are raised.
        """
        defaults = GenArgs(
            max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
            stop=[stop] if isinstance(stop, str) else stop, stop_token_ids=stop_token_ids,
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            ignore_eos=ignore_eos, return_logprob=return_logprob,
            logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs, dtype=normalize_dtype(dtype))
        self._arguments(args, kwargs)  # clear TypeError for bad arguments before running
        call_args, call_kwargs = self._call_kwargs(args, kwargs)
        return run_program(self.func, backend_or_default(backend), call_args, call_kwargs,
                           defaults, stream)

    def run_batch(self, batch_kwargs: list[dict[str, Any]] | list[tuple], *,
                  backend: Any = None, num_threads: int | str = "auto",
                  progress_bar: bool = True, precache: bool | None = None,
                  **sampling: Any) -> list[ProgramState]:
        """Run once per item of `batch_kwargs` (dicts of arguments, or tuples of positional
        ones), concurrently. The program's constant prefix is traced and cached first
        (`precache`; default: `global_config.enable_precache_with_tracing`)."""
        if precache is None:
            precache = global_config.enable_precache_with_tracing
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts (or tuples)")
        if not batch_kwargs:
            return []
        calls = []
        for item in batch_kwargs:
            if isinstance(item, dict):
                self._arguments((), item)
                calls.append(((), item))
            elif isinstance(item, (list, tuple)):
                self._arguments(tuple(item), {})
                calls.append((tuple(item), {}))
            else:
                raise TypeError(f"run_batch: each item must be a dict or tuple, got {item!r}")
        backend = backend_or_default(backend)
        if precache and len(calls) > 1:
            self.precache(backend)
        if num_threads == "auto":
            num_threads = max(64, (os.cpu_count() or 1) * 16)
        num_threads = max(1, min(int(num_threads), len(calls)))

        def one(call: tuple[tuple, dict]) -> ProgramState:
            return self.run(*call[0], backend=backend, **call[1], **sampling)

        with ThreadPoolExecutor(num_threads, thread_name_prefix="radixlm-batch") as pool:
            futures = [pool.submit(one, call) for call in calls]
            if progress_bar:
                from tqdm.auto import tqdm

                for _ in tqdm(as_completed(futures), total=len(futures), desc=self.__name__):
                    pass
            return [f.result() for f in futures]

    def trace_prefix(self, backend: Any = None) -> str:
        """The constant text every run of this program starts with."""
        backend = backend_or_default(backend)
        return extract_prefix(self.func, self.arg_names, self.bind_arguments,
                              backend.get_chat_template)

    def precache(self, backend: Any) -> str:
        """Warm the backend's prefix cache with the traced prefix; returns it ("" if none)."""
        prefix = self.trace_prefix(backend)
        if len(prefix) <= MIN_PREFIX_CHARS:
            return ""
        try:
            backend.cache_prefix(prefix)
        except BackendError as e:  # only an optimization; the runs report their own errors
            logger.warning("prefix pre-caching failed: %s", e)
            return ""
        return prefix
