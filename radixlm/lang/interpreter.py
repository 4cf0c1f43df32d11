"""Executing programs: one worker thread per program state.

The program function runs in the caller's thread and only *submits* expressions
(`s += ...`); a `StreamExecutor` worker thread executes them in order against the backend.
Reading a variable (`s["x"]`) waits for the expression that sets it. A fork creates child
executors with copies of the text so far, each with its own thread, so generations after a
fork run concurrently. A failure inside a running program is recorded as `state.error()`;
later expressions are skipped, and reading a variable that was never set raises ProgramError.
The program-side handle (`ProgramState`, fork groups, `run_program`) is in state.py.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from radixlm.lang.backend.base import Backend, Prompt
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.gen_args import GenArgs
from radixlm.lang.ir import (
    CommitLazy,
    ConstantText,
    Expr,
    ExprList,
    Gen,
    Media,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    VarScopeBegin,
    VarScopeEnd,
)
from radixlm.lang.reasoning import reasoning_var, split_reasoning
from radixlm.lang.tools import parse_calls, tool_calls_var, tool_params

_POLL_S = 0.05


class ProgramError(RuntimeError):
    """A program step failed; the original exception is `__cause__` and `state.error()`."""


class StreamExecutor:
    """Executes one program state's expressions in a worker thread.

    Program-thread side: `submit`, `sync`, `get_var`, `fork`, `end`. Worker side: `_execute`.
    Text, variables and messages are written only by the worker (or before it starts, by fork).
    """

    def __init__(self, backend: Backend, default_params: GenArgs, stream: bool = False,
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
        self._deferred: set[str] = set()  # variables whose event waits for a post-step
        self.error_: BaseException | None = None
        self.is_finished = False
        self.children: list[StreamExecutor] = []
        self.fork_start = 0  # length of the parent's text when this state was forked
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
        if isinstance(e, Media):
            raise ValueError(f"sgl.{e.kind}: this model has no vision input (radixlm serves "
                             "text-only models)")
        if isinstance(e, SeparateReasoning):
            for leaf in e.expr.flatten():
                self._check(leaf)
                if isinstance(leaf, (Gen, Select)):
                    self._check(VarScopeBegin(reasoning_var(leaf.name)))  # registers the name
            return
        if isinstance(e, Gen) and e.params.tools is not None:
            self._check(VarScopeBegin(tool_calls_var(name)))  # registers <name>_tool_calls
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
            child.fork_start = len(self.text_)
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
        elif isinstance(expr, SeparateReasoning):
            self._separate_reasoning(expr.expr, expr.model_type)
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
        if name not in self._deferred:
            self.variable_event.setdefault(name, threading.Event()).set()

    def _prompt(self) -> Prompt:
        content = self.text_[self.cur_role_begin_pos:] if self.cur_role else ""
        return Prompt(self.text_, list(self.messages_), self.cur_role, content)

    def _gen(self, expr: Gen) -> None:
        params = expr.params.merged_over(self.default_params)
        if params.tools is None:
            self._gen_text(expr, params)
            return
        params, setup = tool_params(self.backend, params)
        self._gen_text(expr, params)
        self._set(tool_calls_var(expr.name), parse_calls(setup, self.variables[expr.name]),
                  self.meta_info.get(expr.name))

    def _gen_text(self, expr: Gen, params: GenArgs) -> None:
        numeric = params.dtype in ("int", "float")  # may end in the space/newline it stopped on
        samples = params.n or 1
        if not self.stream or samples > 1:
            if self.stream:
                raise ValueError(f"gen(n={samples}) cannot stream; run without stream=True")
            text, meta = self.backend.generate(self._prompt(), params)
            if samples > 1:  # n samples: the variable is the list, the text the first
                if not isinstance(text, list) or len(text) != samples:
                    raise ValueError(f"the backend returned {text!r} for gen(n={samples})")
                texts = [t.rstrip(" \n") if numeric else t for t in text]
                self._fill(texts[0])
                self._set(expr.name, texts, meta)
                return
            if numeric:
                text = text.rstrip(" \n")
            self._fill(text)
            self._set(expr.name, text, meta)
            return
        start = len(self.text_)
        meta: dict[str, Any] = {}
        if expr.name is not None:
            self.variables[expr.name] = ""
        for piece, chunk_meta in self.backend.generate_stream(self._prompt(), params):
            meta = chunk_meta
            with self.changed:  # readers (text_async_iter) see text and meta together
                self.text_ += piece
                if expr.name is not None:
                    self.variables[expr.name] += piece
                    self.meta_info[expr.name] = meta
            self._notify()
        if numeric:
            self.text_ = self.text_[:start] + self.text_[start:].rstrip(" \n")
        self._set(expr.name, self.text_[start:], meta)

    def _separate_reasoning(self, expr: Expr, model_type: str) -> None:
        """Run `expr`; split the text of each gen/select in it into answer and reasoning.
        The state's text keeps only the answer, except when streaming (already sent)."""
        if isinstance(expr, ExprList):
            for e in expr.exprs:
                self._separate_reasoning(e, model_type)
            return
        if not isinstance(expr, (Gen, Select)):
            self._execute(expr)
            return
        start = len(self.text_)
        self._deferred.add(expr.name)  # readers wait for the split value, not the raw one
        try:
            self._execute(expr)
        finally:
            self._deferred.discard(expr.name)
        value = self.variables[expr.name]
        pairs = [split_reasoning(v, model_type) for v in
                 (value if isinstance(value, list) else [value])]
        reasoning = [p[0] for p in pairs] if isinstance(value, list) else pairs[0][0]
        answer = [p[1] for p in pairs] if isinstance(value, list) else pairs[0][1]
        first = answer[0] if isinstance(answer, list) else answer
        if not self.stream:
            self.text_ = self.text_[:start] + first
        self._set(reasoning_var(expr.name), reasoning, self.meta_info.get(expr.name))
        self._set(expr.name, answer, self.meta_info.get(expr.name))

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
