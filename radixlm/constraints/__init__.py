"""Constrained decoding: regex, JSON schema, choices and dtype specs compiled to token-level
automata (outlines-core), per-request grammar state, bitmask fill and jump-forward.

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


def create_grammar_backend(tokenizer, vocab_size: int, eos_token_ids, **options) -> GrammarBackend:
    """The default backend (outlines-core). ``options``: see ``OutlinesGrammarBackend``."""
    from radixlm.constraints.outlines_backend import OutlinesGrammarBackend

    return OutlinesGrammarBackend(tokenizer, vocab_size, eos_token_ids, **options)


__all__ = [
    "CONSTRAINT_KINDS",
    "ConstraintSpec",
    "Grammar",
    "GrammarBackend",
    "JumpForward",
    "create_grammar_backend",
    "spec_from_sampling_params",
]
