"""Drafts without a draft model: prompt lookup over the request's own tokens, and what the
radix tree's cached sequences say comes next (``--speculative-algorithm NGRAM``).

Four sources, tried in this order each step:

1. **The tree** (``BasePrefixCache.continuation``): when a cached sequence extends the
   request's whole current sequence (an agent's or a template's earlier run of the same
   prefix, a regenerated answer), its next tokens. It is exact-prefix evidence, so it goes
   first; once the request's output departs from it, the tree has nothing past the
   request's length and the query answers [] from then on by itself (a cursor per request
   keeps that query O(new tokens)). Never anything with the no-sharing cache.
2. **JSON values** (``ValueLookup``, with a tokenizer, for a request under a
   ``json_schema``): while the output is inside a value (or at a number's start), the value
   copied from the prompt's document up to its end and closing quote; where it has a
   guess, token and text lookup are not asked (they would run past the value's end or
   match the schema's own text in the prompt).
3. **Prompt lookup** (``NgramIndex``): the longest suffix of prompt + output, between
   ``max_match`` and ``min_match`` tokens, that occurred earlier (the most recent
   occurrence among equally long ones), and what followed it there.
4. **Prompt lookup by text** (``TextLookup``, with a tokenizer), where the others give
   less than two tokens: the prompt's text after the latest occurrence of the text of the
   last few tokens, tokenized. It finds copies whose tokens start differently from the
   prompt's (a JSON value after its quote, a word at a line's start).

Each source has its own ``DraftBudget`` (``policy.py``): the draft length adapts to that
source's acceptance history for this request, and a source whose drafts keep failing
pauses. A draft never runs past the request's ``max_new_tokens`` (its last token comes
from the verification itself). Drafts are suggestions: the verifier decides what is
emitted, so a bad draft costs time, never correctness.

Called on the scheduler thread only; per-request state needs no locks. Plain Python.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from radixlm.radix import BasePrefixCache, ContinuationCursor
from radixlm.runtime.speculative.lookup import NgramIndex
from radixlm.runtime.speculative.policy import DraftBudget, DraftPolicy
from radixlm.runtime.speculative.text import TextLookup, text_codec
from radixlm.runtime.speculative.values import ValueLookup

if TYPE_CHECKING:
    from radixlm.runtime.request import Req

TREE, VALUE, NGRAM, TEXT = "tree", "value", "ngram", "text"
SOURCES = (TREE, VALUE, NGRAM, TEXT)
_TAIL = 8  # output tokens compared per call to notice a rollback (jump-forward retokenizes)
# The JSON-value source's expected acceptance per token before it was verified (pseudo-
# trials of VALUE_PRIOR_WEIGHT tokens): a copied value is mostly taken whole or not at all.
VALUE_PRIOR, VALUE_PRIOR_WEIGHT = 0.75, 8.0
# At a JSON value's opening, prompt lookup drafts only from a match of this many tokens
# (more than the key's closing quote and colon: the end of the same key, e.g. "_date": ").
OPENING_MATCH = 3


class _DraftState:
    """One request: its indexed tokens, tree cursor, text and JSON-value lookups, a budget
    per source and the pending draft."""

    __slots__ = ("index", "n_input", "cursor", "text", "values", "budgets", "source",
                 "drafted_at", "ready")

    def __init__(self, index: NgramIndex, n_input: int, text: TextLookup | None,
                 values: ValueLookup | None, budgets: dict[str, DraftBudget]) -> None:
        self.index, self.n_input, self.text, self.values = index, n_input, text, values
        self.cursor = ContinuationCursor()
        self.budgets = budgets
        self.source: str | None = None  # whose draft awaits ``observe``
        self.drafted_at = 0  # sequence length when that draft was made
        self.ready: tuple[int, list[int]] | None = None  # (length, value draft) of a hint


class NgramDrafter:
    """The ``Drafter`` (``speculative/base.py``) of ``speculative_algorithm="NGRAM"``.

    ``cache``: the engine's prefix cache. ``max_draft_tokens`` bounds every draft (the
    caller's ``max_tokens`` may lower it per step). ``min_match`` / ``max_match``: the
    suffix lengths prompt lookup tries; ``max_candidates``: earlier occurrences of the last
    ``min_match`` tokens it compares. ``policy`` sets the prompt-lookup budget (its
    ``max_tokens`` is replaced by ``max_draft_tokens``); tree drafts start at full length.
    ``use_tree=False`` leaves the tree out; ``tokenizer`` (``decode`` / ``encode``) turns
    on prompt lookup by text (its own budget, under prompt lookup's policy) and, for a
    request with a ``json_schema``, JSON values (a budget under the tree's policy). Of a
    request it reads ``uid`` (the key of its state), ``input_ids``, ``output_ids``,
    ``params.max_new_tokens`` and ``params.json_schema``.
    ``stats`` counts drafts, drafted and accepted tokens per source (``tree_*``,
    ``value_*``, ``ngram_*``, ``text_*``).
    """

    def __init__(self, cache: BasePrefixCache, *, max_draft_tokens: int = 8,
                 min_match: int = 2, max_match: int = 8, max_candidates: int = 8,
                 policy: DraftPolicy | None = None, use_tree: bool = True,
                 tokenizer: Any = None) -> None:
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {max_draft_tokens}")
        NgramIndex(min_match, max_match, max_candidates)  # validates the three
        base = policy or DraftPolicy()
        self.ngram_policy = replace(base, max_tokens=max_draft_tokens,
                                    initial=min(base.initial, max_draft_tokens))
        self.tree_policy = replace(base, max_tokens=max_draft_tokens, initial=max_draft_tokens)
        self.cache, self.use_tree = cache, use_tree
        self.codec = text_codec(tokenizer) if tokenizer is not None else None
        self.max_draft_tokens = max_draft_tokens
        self.min_match, self.max_match, self.max_candidates = min_match, max_match, max_candidates
        self._states: dict[int, _DraftState] = {}
        self.stats = {f"{s}_{k}": 0 for s in SOURCES
                      for k in ("drafts", "drafted_tokens", "accepted_tokens")}

    # ------------------------------------------------------------------ Drafter
    def propose(self, req: Req, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` draft ids continuing ``req.input_ids + req.output_ids``
        (the tree's continuation, else a JSON value, else prompt lookup, else, where that
        gives less than two tokens, lookup by text; [] while all are paused or find
        nothing). Reads ``req``, never changes it."""
        room = req.params.max_new_tokens - len(req.output_ids) - 1
        limit = min(max_tokens, self.max_draft_tokens, room)
        if limit <= 0:
            return []
        st = self._sync(req)
        index, seq_len = st.index, len(st.index)
        st.source = None
        draft: list[int] = []
        budgets = st.budgets
        if self.use_tree and (k := min(limit, budgets[TREE].allowed(seq_len))):
            draft = self.cache.continuation(index.tokens, k, st.cursor)
            st.source = TREE if draft else None
        in_value = opening = False
        if not draft and st.values is not None:
            ctx = st.values.context(index.tokens)
            in_value = ctx is not None
            opening = in_value and not ctx.partial
            if in_value and (k := min(limit, budgets[VALUE].allowed(seq_len))):
                ready = st.ready
                draft = (ready[1][:k] if ready is not None and ready[0] == seq_len
                         else st.values.propose(index.tokens, k, ctx))
                st.source = VALUE if draft else None
        if not draft and (k := min(limit, budgets[NGRAM].allowed(seq_len))):
            draft = index.propose(k)
            if opening and index.match_len < OPENING_MATCH:
                draft = []  # "<key>": " alone: the previous value, rarely this one's
            st.source = NGRAM if draft else None
        if (len(draft) < 2 and st.text is not None and not in_value
                and (k := min(limit, budgets[TEXT].allowed(seq_len))) > len(draft)):
            found = st.text.propose(index.tokens, k)
            if len(found) > len(draft):
                draft, st.source = found, TEXT
        if draft:
            st.drafted_at = seq_len
            self.stats[f"{st.source}_drafts"] += 1
        return draft

    def expected_rate(self, req: Req) -> float | None:
        """The acceptance per draft token to plan ``req``'s next draft with, where it is
        writing a JSON value the value source has a draft for (that source's record over
        all requests, from ``VALUE_PRIOR``): its copies are far surer than the request's
        other drafts. None elsewhere (the scheduler's own rate for the request)."""
        if self.codec is None or getattr(req.params, "json_schema", None) is None:
            return None
        st = self._sync(req)
        seq_len = len(st.index)
        st.ready = None
        if st.values is None or not st.budgets[VALUE].allowed(seq_len):
            return None
        ctx = st.values.context(st.index.tokens)
        draft = (st.values.propose(st.index.tokens, self.max_draft_tokens, ctx)
                 if ctx is not None else [])
        st.ready = (seq_len, draft)
        if not draft:
            return None
        accepted, drafted = self.stats["value_accepted_tokens"], self.stats["value_drafted_tokens"]
        return (accepted + VALUE_PRIOR * VALUE_PRIOR_WEIGHT) / (drafted + VALUE_PRIOR_WEIGHT)

    def observe(self, req: Req, num_drafted: int, num_accepted: int) -> None:
        """Feed the verification of the last draft into its source's budget."""
        st = self._states.get(req.uid)
        if st is None or st.source is None:
            return
        st.budgets[st.source].update(num_drafted, num_accepted, st.drafted_at)
        self.stats[f"{st.source}_drafted_tokens"] += max(num_drafted, 0)
        self.stats[f"{st.source}_accepted_tokens"] += max(num_accepted, 0)
        st.source = None

    def release(self, req: Req) -> None:
        self._states.pop(req.uid, None)

    # ------------------------------------------------------------------ state
    @property
    def num_tracked(self) -> int:
        """Requests with drafting state (for leak checks: 0 once all are released)."""
        return len(self._states)

    def _sync(self, req: Req) -> _DraftState:
        """The request's state, its index brought up to ``input_ids + output_ids``:
        appended tokens are indexed; a rollback (output shorter, or changed within the
        last ``_TAIL`` tokens) truncates the index to the common prefix first."""
        st = self._states.get(req.uid)
        n_input, out = len(req.input_ids), req.output_ids
        if st is None or st.n_input != n_input:
            index = NgramIndex(self.min_match, self.max_match, self.max_candidates)
            index.extend(list(req.input_ids))
            text = TextLookup(self.codec, n_input) if self.codec is not None else None
            schema = getattr(req.params, "json_schema", None)
            values = (ValueLookup(self.codec, n_input, schema)
                      if self.codec is not None and schema is not None else None)
            st = _DraftState(index, n_input, text, values, {
                TREE: DraftBudget(self.tree_policy), VALUE: DraftBudget(self.tree_policy),
                NGRAM: DraftBudget(self.ngram_policy), TEXT: DraftBudget(self.ngram_policy)})
            self._states[req.uid] = st
        index = st.index
        have = len(index) - n_input
        mine = index.tokens
        tail = max(have - _TAIL, 0)
        if have > len(out) or out[tail:have] != mine[n_input + tail :]:
            keep = _common_prefix(out, mine, n_input)
            index.truncate(n_input + keep)
            st.cursor.reset()
            have = keep
        if len(out) > have:
            index.extend(out[have:])
        return st


def _common_prefix(out: list[int], tokens: list[Any], offset: int) -> int:
    """Length of the common prefix of ``out`` and ``tokens[offset:]``."""
    n = min(len(out), len(tokens) - offset)
    for i in range(n):
        if out[i] != tokens[offset + i]:
            return i
    return n
