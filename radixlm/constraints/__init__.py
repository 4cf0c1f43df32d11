"""Constrained decoding: regex, JSON schema, choices, dtype, EBNF and structural-tag specs
compiled by a grammar backend (llguidance by default, outlines-core selectable), per-request
grammar state, bitmask fill and jump-forward.

Entry points for the runtime: ``spec_from_sampling_params`` and ``create_grammar_backend``.
Importing the package loads no grammar engine: the names below load their module on first
use, and ``specs`` (what the frontend imports) is plain Python.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.constraints.base import GrammarBackend

GRAMMAR_BACKENDS = ("llguidance", "outlines")

_EXPORTS = {
    "CONSTRAINT_KINDS": "specs",
    "ConstraintSpec": "specs",
    "spec_from_sampling_params": "specs",
    "Grammar": "base",
    "GrammarBackend": "base",
    "JumpForward": "base",
}


def create_grammar_backend(tokenizer, vocab_size: int, eos_token_ids,
                           backend: str = "llguidance", **options) -> GrammarBackend:
    """``backend``: "llguidance" (default; ``LLGuidanceBackend``) or "outlines"
    (``OutlinesGrammarBackend``); ``options`` go to its constructor."""
    if backend == "llguidance":
        from radixlm.constraints.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, vocab_size, eos_token_ids, **options)
    if backend == "outlines":
        from radixlm.constraints.outlines_backend import OutlinesGrammarBackend

        return OutlinesGrammarBackend(tokenizer, vocab_size, eos_token_ids, **options)
    raise ValueError(f"grammar backend must be one of {', '.join(GRAMMAR_BACKENDS)}, "
                     f"got {backend!r}")


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "CONSTRAINT_KINDS",
    "ConstraintSpec",
    "Grammar",
    "GRAMMAR_BACKENDS",
    "GrammarBackend",
    "JumpForward",
    "create_grammar_backend",
    "spec_from_sampling_params",
]
