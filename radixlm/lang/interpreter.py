"""Executing programs: one worker thread per program state.

The program function runs in the caller's thread and only *submits* expressions
(`s += ...`); a `StreamExecutor` worker thread executes them in order against the backend.
Reading a variable (`s["x"]`) waits for the expression that sets it. A fork creates child
executors with copies of the text so far, each with its own thread, so generations after a
fork run concurrently. A failure inside a running program is recorded as `state.error()`;
later expressions are skipped, and reading a variable that was never set raises ProgramError.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixlm.lang.backend.base import Backend, Prompt
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.ir import (
    CommitLazy,
    ConstantText,
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    SamplingParams,
    Select,
    VarScopeBegin,
    VarScopeEnd,
    to_expr,
)

_POLL_S = 0.05


class ProgramError(RuntimeError):
    """A program step failed; the original exception is `__cause__` and `state.error()`."""


class StreamExecutor:
    """Executes one program state's expressions in a worker thread.

    Program-thread side: `submit`, `sync`, `get_var`, `fork`, `end`. Worker side: `_execute`.
    Text, variables and messages are written only by the worker (or before it starts, by fork).
    """

    def __init__(self, backend: Backend, default_params: SamplingParams, stream: bool = False,
                 chat_template: ChatTemplate | None = None) -> None:
        self.backend = backend
        self.default_params = default_params
        self.stream = stream
        self._chat_template = chat_template
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.variable_event: dict[str, threading.Event] = {}
        self.cur_role: str | None = None
        self.cur_role_begin_pos = 0
        self.var_scope_pos: dict[str, int] = {}
        self.error_: BaseException | None = None
        self.is_finished = False
        self.children: list[StreamExecutor] = []
        self.changed = threading.Condition()  # notified on every text/variable change
        # Program-thread bookkeeping, checked when an expression is submitted.
        self._names: set[str] = set()
        self._submit_role: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, daemon=True, name="radixlm-program")
        self._worker.start()

    # ---- program-thread side -------------------------------------------------------------

    def submit(self, expr: Expr) -> None:
        """Check `expr` (names, role nesting) and queue it; ValueError on misuse."""
        for leaf in expr.flatten():
            self._check(leaf)
        self._queue.put(expr)

    def _check(self, e: Expr) -> None:
        name = getattr(e, "name", None)
        if isinstance(e, (Gen, Select, VarScopeBegin)) and name is not None:
            if name in self._names:
                raise ValueError(f"variable name {name!r} is already used in this program")
            self._names.add(name)
            self.variable_event[name] = threading.Event()
        elif isinstance(e, RoleBegin):
            if self._submit_role is not None:
                raise ValueError(f"roles cannot nest: {e.role!r} begins inside "
                                 f"{self._submit_role!r}")
            self._submit_role = e.role
        elif isinstance(e, RoleEnd):
            if self._submit_role != e.role:
                raise ValueError(f"role {e.role!r} ends but the open role is "
                                 f"{self._submit_role!r}")
            self._submit_role = None

    def sync(self) -> None:
        """Wait until every submitted expression has been executed (or skipped)."""
        self._queue.join()

    def end(self) -> None:
        """Finish: drain the queue, stop the worker and those of all forks."""
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()
        for child in self.children:
            child.end()

    def get_var(self, name: str) -> Any:
        event = self.variable_event.get(name)
        if event is not None:
            while not event.wait(_POLL_S):
                if not self._worker.is_alive():
                    break
        if name in self.variables:
            return self.variables[name]
        if self.error_ is not None:
            raise ProgramError(f"variable {name!r} was not set: the program failed with "
                               f"{type(self.error_).__name__}: {self.error_}") from self.error_
        raise KeyError(f"no variable {name!r}; defined: {sorted(self.variables)}")

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self.variables[name] = value
        self._names.add(name)
        self.variable_event.setdefault(name, threading.Event()).set()

    def fork(self, size: int) -> list[StreamExecutor]:
        """Children that start from this state's text, messages and variables."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be a positive int, got {size!r}")
        if size > 1:
            self.submit(CommitLazy())  # children then share the prefix from the cache
        self.sync()
        children = []
        for _ in range(size):
            child = StreamExecutor(self.backend, self.default_params, self.stream,
                                   self._chat_template)
            child.text_ = self.text_
            child.messages_ = list(self.messages_)
            child.variables = dict(self.variables)
            child.meta_info = dict(self.meta_info)
            child.variable_event = {k: _set_event() for k in self.variables}
            child.cur_role, child.cur_role_begin_pos = self.cur_role, self.cur_role_begin_pos
            child.error_ = self.error_
            child._names = set(self._names)
            child._submit_role = self._submit_role
            children.append(child)
        self.children.extend(children)
        return children

    # ---- worker side ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            expr = self._queue.get()
            try:
                if expr is None:
                    return
                if self.error_ is None:
                    try:
                        self._execute(expr)
                    except BaseException as e:  # recorded; the program thread sees it
                        self.error_ = e
                if self.error_ is not None:  # nothing more will set these
                    for event in list(self.variable_event.values()):
                        event.set()
            finally:
                self._queue.task_done()
                if expr is None:
                    self.is_finished = True
                self._notify()

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, ExprList):
            for e in expr.exprs:
                self._execute(e)
        elif isinstance(expr, ConstantText):
            self._fill(expr.value)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, VarScopeBegin):
            self.var_scope_pos[expr.name] = len(self.text_)
        elif isinstance(expr, VarScopeEnd):
            self._set(expr.name, self.text_[self.var_scope_pos.pop(expr.name):], None)
        elif isinstance(expr, CommitLazy):
            if self.text_:
                self.backend.cache_prefix(self.text_)
        else:
            raise TypeError(f"cannot execute {type(expr).__name__}")

    def _fill(self, text: str) -> None:
        self.text_ += text
        self._notify()

    def _set(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        self.variables[name] = value
        self.meta_info[name] = meta
        self.variable_event.setdefault(name, threading.Event()).set()

    def _prompt(self) -> Prompt:
        content = self.text_[self.cur_role_begin_pos:] if self.cur_role else ""
        return Prompt(self.text_, list(self.messages_), self.cur_role, content)

    def _gen(self, expr: Gen) -> None:
        params = expr.params.merged_over(self.default_params)
        if not self.stream:
            text, meta = self.backend.generate(self._prompt(), params)
            self._fill(text)
            self._set(expr.name, text, meta)
            return
        start = len(self.text_)
        meta: dict[str, Any] = {}
        if expr.name is not None:
            self.variables[expr.name] = ""
        for piece, chunk_meta in self.backend.generate_stream(self._prompt(), params):
            meta = chunk_meta
            self.text_ += piece
            if expr.name is not None:
                self.variables[expr.name] += piece
            self._notify()
        self._set(expr.name, self.text_[start:], meta)

    def _select(self, expr: Select) -> None:
        decision = self.backend.select(self._prompt(), expr.choices, expr.temperature,
                                       expr.method)
        self._fill(decision.decision)
        self._set(expr.name, decision.decision, decision.meta_info)

    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            self._chat_template = self.backend.get_chat_template()
        return self._chat_template

    def _role_begin(self, role: str) -> None:
        template = self.chat_template
        first = not self.messages_
        if first:
            self._fill(template.leading_text)
            if role != "system" and template.preamble:
                system = template.default_system_prompt
                if system is not None:
                    self.messages_.append({"role": "system", "content": system})
                self._fill(template.preamble)
        self._fill(template.segments(role)[0])
        self.cur_role, self.cur_role_begin_pos = role, len(self.text_)

    def _role_end(self, role: str) -> None:
        content = self.text_[self.cur_role_begin_pos:]
        self._fill(self.chat_template.end_text(role))
        self.messages_.append({"role": role, "content": content})
        self.cur_role = None


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


class _RoleScope:
    def __init__(self, state: ProgramState, begin: Expr, end: Expr) -> None:
        self.state, self.begin, self.end = state, begin, end

    def __enter__(self) -> ProgramState:
        self.state.executor.submit(self.begin)
        return self.state

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.state.executor.submit(self.end)


class ProgramState:
    """The `s` of a program: append with `+=`, read variables with `s["name"]`."""

    def __init__(self, executor: StreamExecutor) -> None:
        self.executor = executor
        self.ret_value: Any = None

    def __iadd__(self, other: Any) -> ProgramState:
        self.executor.submit(to_expr(other))
        return self

    def __getitem__(self, name: str) -> Any:
        return self.executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.executor.variables

    def get_var(self, name: str) -> Any:
        return self.executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        """Backend metadata of the step that set `name` (tokens, cached_tokens, logprobs...)."""
        self.executor.get_var(name)
        return self.executor.meta_info.get(name)

    def sync(self) -> None:
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

    def _role(self, role: str, expr: Any) -> Any:
        if expr is None:
            return _RoleScope(self, RoleBegin(role), RoleEnd(role))
        self.executor.submit(ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)]))
        return None

    def system(self, expr: Any = None) -> Any:
        """Append a system message, or with no argument, a `with` scope for one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def var_scope(self, name: str) -> _RoleScope:
        """`with s.var_scope("x"): ...` sets `s["x"]` to the text appended inside."""
        return _RoleScope(self, VarScopeBegin(name), VarScopeEnd(name))

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

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """Async version of `text_iter`."""
        it = self.text_iter(var_name)
        loop = asyncio.get_running_loop()
        done = object()
        while True:
            piece = await loop.run_in_executor(None, next, it, done)
            if piece is done:
                return
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
        elif mode == "concate_join":
            start = len(self.src.text())
            self.src += "".join(s.executor.text_[start:] for s in self.states)
        else:
            raise ValueError(f"unknown join mode {mode!r}")
        if src.error_ is None:
            src.error_ = next((s.executor.error_ for s in self.states if s.executor.error_),
                              None)


def run_program(func: Callable[..., Any], backend: Backend, args: tuple, kwargs: dict,
                default_params: SamplingParams, stream: bool) -> ProgramState:
    """Run `func(state, *args, **kwargs)`; with `stream` return at once, the program running
    in a background thread."""
    state = ProgramState(StreamExecutor(backend, default_params, stream=stream))

    def body() -> None:
        try:
            state.ret_value = func(state, *args, **kwargs)
        except ProgramError:
            pass  # the cause is already state.error()
        except BaseException as e:
            if not stream:
                raise
            state.executor.error_ = state.executor.error_ or e
        finally:
            state.executor.end()

    if stream:
        threading.Thread(target=body, daemon=True, name="radixlm-program-main").start()
    else:
        body()
    return state
