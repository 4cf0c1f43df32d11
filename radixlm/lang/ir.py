"""Expressions of the frontend language.

A program appends expressions to its state (`s += "text" + gen("x")`). Expressions are plain
data: the interpreter (interpreter.py) executes them against a backend, the tracer
(tracer.py) reads their constant prefix. `+` between expressions (or an expression and a str)
builds an `ExprList`. `RoleMethods` gives both kinds of state `s.user(...)` and friends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.lang.gen_args import GenArgs


class StopTracing(Exception):
    """Raised where a traced program stops being constant (see tracer.py)."""


class Expr:
    """Base of all expressions. `a + b` concatenates into an ExprList."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([to_expr(other), self])

    def flatten(self) -> Iterator[Expr]:
        """Yield the leaf expressions in order."""
        yield self


def to_expr(value: Any) -> Expr:
    """Turn a str into a ConstantText; pass expressions through; TypeError otherwise."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return ConstantText(value)
    raise TypeError(
        f"cannot append a {type(value).__name__} to a program state; "
        "use a str or a radixlm expression (gen, select, user, ...)"
    )


@dataclass(eq=False)
class ExprList(Expr):
    exprs: list[Expr]

    def flatten(self) -> Iterator[Expr]:
        for e in self.exprs:
            yield from e.flatten()


@dataclass(eq=False)
class ConstantText(Expr):
    value: str


@dataclass(eq=False)
class Gen(Expr):
    name: str | None
    params: GenArgs = field(default_factory=GenArgs)


@dataclass(eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float
    method: Any  # choices.ChoicesSamplingMethod


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """After `expr` ran: split the reasoning out of each gen/select variable it set (see
    reasoning.py); the variable keeps the answer, `<name>_reasoning_content` the reasoning."""

    model_type: str
    expr: Expr

    def flatten(self) -> Iterator[Expr]:
        yield self


@dataclass(eq=False)
class Media(Expr):
    """`image(...)` / `video(...)`: refused when appended (no model here takes vision input)."""

    kind: str
    source: Any


@dataclass(eq=False)
class CommitLazy(Expr):
    """Send the text so far to the backend's prefix cache (used before a fork)."""


class Argument(Expr):
    """A placeholder for a program argument while tracing (see tracer.py).

    Concatenation works (so the constant text before it is kept); any other use — str(),
    iteration, attribute access, truth value — stops the trace.
    """

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTracing(f"argument {self._name!r} used")

    __str__ = __format__ = __iter__ = __len__ = __bool__ = __getitem__ = _stop
    __call__ = __int__ = __float__ = __eq__ = __lt__ = __gt__ = __contains__ = _stop
    __hash__ = object.__hash__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._stop()

    def __repr__(self) -> str:
        return f"Argument({self._name!r})"


class ExprScope:
    """`with s.user(): ...` (or `s.var_scope(name)`): append `begin` on entry and `end` on a
    clean exit to `state` (anything that takes expressions with `+=`)."""

    def __init__(self, state: Any, begin: Expr, end: Expr) -> None:
        self.state, self.begin, self.end = state, begin, end

    def __enter__(self) -> Any:
        self.state += self.begin
        return self.state

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.state += self.end


class RoleMethods:
    """`s.system/user/assistant(expr)` for a state that takes expressions with `+=`: append
    the message, or with no argument return a `with` scope for one."""

    def _role(self, role: str, expr: Any = None) -> ExprScope | None:
        if expr is None:
            return ExprScope(self, RoleBegin(role), RoleEnd(role))
        self += ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)])
        return None

    def system(self, expr: Any = None) -> ExprScope | None:
        """Append a system message, or with no argument, a `with` scope for one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> ExprScope | None:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> ExprScope | None:
        return self._role("assistant", expr)
