"""Prompt lookup: the simplest drafter, over the request's own tokens.

Where the last ``w`` tokens (``w`` from ``speculative_ngram_max_match_window_size`` down to
``speculative_ngram_min_match_window_size``) occurred before in the prompt or the output,
the draft is what followed their latest earlier occurrence. It keeps a per-request index of
those n-grams, extended as tokens arrive, so a proposal costs a few dict look-ups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.runtime.request import Req


@dataclass
class _Index:
    """n-gram -> the position right after its latest occurrence, over ``indexed`` tokens."""

    ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in ``ends``
    last_id: int = -1  # the token at ``indexed - 1`` then (changed: rolled back, rebuild)


class PromptLookupDrafter:
    """Drafts by suffix match over ``req.input_ids + req.output_ids`` (see the module)."""

    def __init__(self, config, cache=None) -> None:
        self.min_window = config.speculative_ngram_min_match_window_size
        self.max_window = config.speculative_ngram_max_match_window_size
        self._index: dict[str, _Index] = {}

    def propose(self, req: Req, max_tokens: int) -> list[int]:
        if max_tokens <= 0:
            return []
        seq = req.input_ids + req.output_ids
        n = len(seq)
        idx = self._index.get(req.rid)
        if idx is None or idx.indexed > n or (idx.indexed and seq[idx.indexed - 1]
                                              != idx.last_id):
            idx = self._index[req.rid] = _Index()  # new, or its tokens were rolled back
        lo, hi = self.min_window, self.max_window
        for end in range(max(idx.indexed, 1), n):  # n-grams seq[end - w:end], then seq[end]
            for w in range(lo, min(hi, end) + 1):
                idx.ends[tuple(seq[end - w:end])] = end
        idx.indexed, idx.last_id = n, seq[n - 1]
        for w in range(min(hi, n - 1), lo - 1, -1):
            start = idx.ends.get(tuple(seq[n - w:]))
            if start is not None:
                return seq[start:start + max_tokens]
        return []

    def observe(self, req: Req, num_drafted: int, num_accepted: int) -> None:
        """No adaptation of its own: the scheduler sizes drafts from acceptance history."""

    def release(self, req: Req) -> None:
        self._index.pop(req.rid, None)
