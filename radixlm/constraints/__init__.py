"""Constrained decoding: regex, JSON schema, choices, dtype, EBNF and structural-tag specs
compiled by a grammar backend (llguidance by default, outlines-core selectable), per-request
grammar state, bitmask fill and jump-forward.

Entry points for the runtime: ``spec_from_sampling_params`` and ``create_grammar_backend``.
"""

from radixlm.constraints.base import (
    CONSTRAINT_KINDS,
    ConstraintSpec,
    Grammar,
    GrammarBackend,
    JumpForward,
)
from radixlm.constraints.specs import spec_from_sampling_params

GRAMMAR_BACKENDS = ("llguidance", "outlines")


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
