"""Documents that close within ``max_new_tokens`` (``complete_within_max_tokens``): the check
made once a request's grammar is built, before it is queued for a step.

The steering itself is the postprocessor's (``runtime.scheduler.postprocess``): after every
token it asks the grammar for its close (``Grammar.close_tokens``) and forces it when the
room left equals its length. This module only refuses, up front, what cannot fit: a grammar
that cannot compute a close, or one whose shortest document from the start is longer than
the request's ``max_new_tokens``. Both are a ``ValueError`` from the request's grammar
future, which the scheduler answers as an invalid constraint (a 400 on the HTTP routes).
"""

from __future__ import annotations

from concurrent.futures import Future

from radixlm.constraints.base import Grammar
from radixlm.constraints.closing import MAX_START_BYTES


def fits_budget(grammar: Grammar, max_new_tokens: int) -> Grammar:
    """``grammar`` if a document from its start state fits in ``max_new_tokens`` tokens;
    ValueError naming both numbers otherwise (or naming why no close can be computed)."""
    close = grammar.close_tokens()
    if close is None:
        raise ValueError("complete_within_max_tokens: no valid completion of this grammar "
                         "was found (the search is bounded: a shortest document longer than "
                         f"{MAX_START_BYTES} bytes, or a pattern it cannot steer, is not "
                         "found; the outlines grammar backend cannot search at all)")
    if len(close) > max_new_tokens:
        raise ValueError(f"complete_within_max_tokens: the shortest valid output takes "
                         f"{len(close)} tokens, more than max_new_tokens={max_new_tokens}")
    return grammar


def checked_for_budget(compiled: Future[Grammar], max_new_tokens: int) -> Future[Grammar]:
    """A future of ``compiled``'s grammar that fails (ValueError) where ``fits_budget``
    refuses it; a cancel of the result cancels ``compiled``."""
    out: Future[Grammar] = Future()

    def relay(f: Future) -> None:
        if f.cancelled():
            out.cancel()
            return
        try:
            result: Grammar | BaseException = fits_budget(f.result(), max_new_tokens)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            result = exc
        try:
            if isinstance(result, BaseException):
                out.set_exception(result)
            else:
                out.set_result(result)
        except Exception:  # noqa: BLE001 - cancelled meanwhile (the request ended)
            pass

    out.add_done_callback(lambda o: compiled.cancel() if o.cancelled() else None)
    compiled.add_done_callback(relay)
    return out
