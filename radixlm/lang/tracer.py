"""Find the constant text a program starts with, to warm the prefix cache before a batch.

The program runs once against a `TracerState` with `Argument` placeholders for its
arguments. Constant text and roles are recorded; the first thing whose text depends on an
argument or on the model (a placeholder, gen, select, reading a variable, fork) stops the
trace. Programs that do something the tracer cannot follow simply yield a shorter prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.ir import (
    Argument,
    ConstantText,
    Expr,
    RoleBegin,
    RoleEnd,
    RoleMethods,
    StopTracing,
    to_expr,
)

logger = logging.getLogger(__name__)

# A shorter prefix is not worth a request of its own.
MIN_PREFIX_CHARS = 64


class TracerState(RoleMethods):
    """Stands in for ProgramState while tracing; records the constant expressions."""

    def __init__(self) -> None:
        self.nodes: list[Expr] = []

    def __iadd__(self, other: Any) -> TracerState:
        for leaf in to_expr(other).flatten():
            if not isinstance(leaf, (ConstantText, RoleBegin, RoleEnd)):
                raise StopTracing(type(leaf).__name__)
            self.nodes.append(leaf)
        return self

    def __getitem__(self, name: str) -> Any:
        raise StopTracing(f"read of {name!r}")

    def __getattr__(self, name: str) -> Any:
        raise StopTracing(f"state.{name}")


def render_prefix(nodes: list[Expr], template_getter: Callable[[], ChatTemplate]) -> str:
    """The text the interpreter would write for `nodes` (same role rendering)."""
    text, first, role_open = "", True, None
    for node in nodes:
        if isinstance(node, ConstantText):
            text += node.value
        elif isinstance(node, RoleBegin):
            template = template_getter()
            if first:
                text += template.leading_text
                if node.role != "system":
                    text += template.preamble
            text += template.segments(node.role)[0]
            role_open = node.role
        elif isinstance(node, RoleEnd) and role_open is not None:
            text += template.end_text(node.role)
            first, role_open = False, None
    return text


def extract_prefix(func: Callable[..., Any], arg_names: list[str], bound: dict[str, Any],
                   template_getter: Callable[[], ChatTemplate]) -> str:
    """Trace `func` with placeholder arguments and return its constant leading text."""
    tracer = TracerState()
    arguments: dict[str, Any] = {name: Argument(name) for name in arg_names}
    arguments.update(bound)
    try:
        func(tracer, **arguments)
    except StopTracing:
        pass
    except Exception as e:  # the program did something the tracer cannot follow
        logger.debug("tracing stopped early: %r", e)
    try:
        return render_prefix(tracer.nodes, template_getter)
    except Exception as e:
        logger.debug("cannot render the traced prefix: %r", e)
        return ""
