"""`ProgramState` (the `s` of a program), fork groups, and running a program function.

The state is the program thread's handle on a `StreamExecutor` (interpreter.py): `+=`
submits expressions, `s["x"]` waits for a variable, `fork` makes concurrent copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixlm.lang.backend.base import Backend
from radixlm.lang.gen_args import GenArgs
from radixlm.lang.global_config import global_config
from radixlm.lang.interpreter import _POLL_S, ProgramError, StreamExecutor
from radixlm.lang.ir import Expr, ExprScope, RoleMethods, VarScopeBegin, VarScopeEnd, to_expr


class ProgramState(RoleMethods):
    """The `s` of a program: append with `+=`, read variables with `s["name"]`, open roles
    with `s.user(...)` (or `with s.user(): ...`)."""

    def __init__(self, executor: StreamExecutor) -> None:
        self.executor = executor
        self.ret_value: Any = None
        self._program: threading.Thread | None = None  # run(stream=True)'s function

    def _settle(self, name: str | None = None) -> None:
        """Read from outside a program that runs in the background (``stream=True``): wait
        until its function has returned, as it may not have submitted a step yet and an
        empty queue would pass for done; for a variable, only until the variable exists."""
        program = self._program
        if program is None or program is threading.current_thread():
            return
        if name is None or name not in self.executor.variable_event:
            program.join()

    def __iadd__(self, other: Any) -> ProgramState:
        self.executor.submit(to_expr(other))
        return self

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.executor.variables

    def get_var(self, name: str) -> Any:
        self._settle(name)
        return self.executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        """Backend metadata of the step that set `name` (tokens, cached_tokens, logprobs...)."""
        self.get_var(name)
        return self.executor.meta_info.get(name)

    def sync(self) -> None:
        self._settle()
        self.executor.sync()

    def text(self) -> str:
        self.sync()
        return self.executor.text_

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return list(self.executor.messages_)

    def error(self) -> BaseException | None:
        self.sync()
        return self.executor.error_

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """`size` copies of this state that continue independently (and concurrently)."""
        return ProgramStateGroup([ProgramState(e) for e in self.executor.fork(size)], self)

    @contextlib.contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """`with s.copy() as c: c += ...`: a one-state fork, joined back (its new variables
        gathered into lists in `s`) when the block ends, as SGLang's `copy`."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def var_scope(self, name: str) -> ExprScope:
        """`with s.var_scope("x"): ...` sets `s["x"]` to the text appended inside."""
        return ExprScope(self, VarScopeBegin(name), VarScopeEnd(name))

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield new text as it is produced (of the whole state or of one variable).

        Without `stream=True` this yields the final value once.
        """
        ex = self.executor
        if not ex.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        sent = 0
        while True:
            with ex.changed:
                finished = ex.is_finished or (
                    var_name is not None and _event_set(ex.variable_event.get(var_name)))
                current = ex.text_ if var_name is None else ex.variables.get(var_name, "")
                if len(current) == sent and not finished:
                    ex.changed.wait(_POLL_S)
                    continue
            if len(current) > sent:
                yield current[sent:]
                sent = len(current)
            elif finished:
                return

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """Async version of `text_iter`. With `return_meta_data` (a variable only) yield
        `(piece, meta_info)` pairs, the backend's meta info of that variable so far."""
        if return_meta_data and var_name is None:
            raise ValueError("return_meta_data needs var_name (meta info is per variable)")
        it = self.text_iter(var_name)
        loop = asyncio.get_running_loop()
        done = object()
        while True:
            piece = await loop.run_in_executor(None, next, it, done)
            if piece is done:
                return
            if return_meta_data:
                with self.executor.changed:
                    meta = self.executor.meta_info.get(var_name)
                yield piece, meta
            else:
                yield piece

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


def _event_set(event: threading.Event | None) -> bool:
    return event is not None and event.is_set()


class ProgramStateGroup:
    """The result of `s.fork(n)`: index it, iterate it, `+=` to all, `join()` back."""

    def __init__(self, states: list[ProgramState], src: ProgramState) -> None:
        self.states = states
        self.src = src

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if value is not self.states[i]:
            raise TypeError("a forked state can only be extended with +=, not replaced")

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        """Append to every fork: an expression/str, a list (one per fork), or fn(i) -> expr."""
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} items for {len(self.states)} forks")
            items = list(other)
        elif callable(other) and not isinstance(other, Expr):
            items = [other(i) for i in range(len(self.states))]
        else:
            items = [other] * len(self.states)
        for state, item in zip(self.states, items, strict=True):
            state += item
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for all forks and copy their new variables to the parent as lists.

        `mode="concate_join"` instead appends every fork's new text to the parent's text.
        """
        src = self.src.executor
        for state in self.states:
            state.sync()
        if mode == "gather_variable":
            self.src.sync()
            before = set(src.variables)
            for state in self.states:
                ex = state.executor
                for k in ex.variables:
                    if k not in before:
                        src.variables.setdefault(k, []).append(ex.variables[k])
                        src.meta_info.setdefault(k, []).append(ex.meta_info.get(k))
                        src._names.add(k)
                        src.variable_event.setdefault(k, threading.Event()).set()
        elif mode in ("concate_and_append", "concate_join"):
            self.src += "".join(s.executor.text_[s.executor.fork_start:] for s in self.states)
        else:
            raise ValueError(f"unknown join mode {mode!r}")
        if src.error_ is None:
            src.error_ = next((s.executor.error_ for s in self.states if s.executor.error_),
                              None)


def run_program(func: Callable[..., Any], backend: Backend, args: tuple, kwargs: dict,
                default_params: GenArgs, stream: bool) -> ProgramState:
    """Run `func(state, *args, **kwargs)`; with `stream` return at once, the program running
    in a background thread."""
    state = ProgramState(StreamExecutor(backend, default_params, stream=stream))

    def body() -> None:
        try:
            state.ret_value = func(state, *args, **kwargs)
        except ProgramError as e:  # a step failed; keep its cause (maybe from a fork)
            state.executor.error_ = state.executor.error_ or e.__cause__ or e
        except BaseException as e:
            if not stream:
                raise
            state.executor.error_ = state.executor.error_ or e
        finally:
            state.executor.end()
        if global_config.verbosity >= 2:  # SGLang: print the final text of every run
            print(state.executor.text_)

    if stream:
        state._program = threading.Thread(target=body, daemon=True, name="radixlm-program-main")
        state._program.start()
    else:
        body()
    return state
