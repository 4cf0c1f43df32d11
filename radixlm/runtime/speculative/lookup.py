"""Prompt lookup over one sequence: where did its current suffix occur before, and what
followed it there? An index kept incrementally as tokens arrive (hash chains, as in LZ77),
so a query costs a few dictionary probes, never a rescan of the context. Pure Python.
"""

from __future__ import annotations


class NgramIndex:
    """The tokens of one sequence and, for every position, where the same ``min_match``
    tokens ended before.

    Index: ``heads[gram]`` is the latest end position ``e`` (``tokens[e - min_match:e] ==
    gram``) whose following token is known (``e < len(tokens)``), and ``prev[e]`` the end
    of the occurrence before that one (-1: none), so the occurrences of a gram are a chain,
    newest first. Appending a token indexes one position (one tuple, one dict probe).

    ``propose`` finds the longest suffix of the sequence, from ``max_match`` down to
    ``min_match`` tokens, that occurred earlier, preferring the most recent occurrence among
    equally long ones; it looks at the newest ``max_candidates`` occurrences of the last
    ``min_match`` tokens only (a bound on the cost of common grams). A draft that runs into
    the end of the sequence repeats the span from the match to the end (the pattern of a
    loop continues).
    """

    __slots__ = ("min_match", "max_match", "max_candidates", "tokens", "heads", "prev",
                 "match_len")

    def __init__(self, min_match: int, max_match: int, max_candidates: int = 8) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, "
                             f"max_match={max_match}")
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.min_match, self.max_match, self.max_candidates = min_match, max_match, max_candidates
        self.tokens: list[int] = []
        self.heads: dict[tuple[int, ...], int] = {}
        self.prev: list[int] = []  # prev[e] for every e < len(tokens); -1 below min_match
        self.match_len = 0  # length of the suffix match behind the last proposal

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens and index the positions whose next token is now known."""
        toks, heads, prev, m = self.tokens, self.heads, self.prev, self.min_match
        toks += new_tokens
        for e in range(len(prev), len(toks)):
            if e < m:
                prev.append(-1)
                continue
            gram = tuple(toks[e - m : e])
            prev.append(heads.get(gram, -1))
            heads[gram] = e

    def truncate(self, length: int) -> None:
        """Forget every token from ``length`` on (a rollback), undoing their index entries
        exactly, newest first."""
        toks, heads, prev, m = self.tokens, self.heads, self.prev, self.min_match
        for e in range(len(prev) - 1, max(length, m) - 1, -1):
            gram = tuple(toks[e - m : e])
            if prev[e] < 0:
                del heads[gram]
            else:
                heads[gram] = prev[e]
        del toks[length:], prev[length:]

    def propose(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the best earlier match of the current
        suffix; [] if the last ``min_match`` tokens never occurred before."""
        toks, m = self.tokens, self.min_match
        n = len(toks)
        self.match_len = 0
        if max_tokens <= 0 or n <= m:
            return []
        e = self.heads.get(tuple(toks[n - m :]), -1)
        best_end, best_len, tries = -1, 0, 0
        top = self.max_match
        suffix = toks[n - top :] if n >= top else None
        while e >= 0 and tries < self.max_candidates:
            if e >= top and toks[e - top : e] == suffix:  # the longest match: one compare
                best_end, best_len = e, top
                break
            length, limit = m, min(top, e)
            while length < limit and toks[e - length - 1] == toks[n - length - 1]:
                length += 1
            if length > best_len:
                best_end, best_len = e, length
            e, tries = self.prev[e], tries + 1
        if best_end < 0:
            return []
        self.match_len = best_len
        draft = toks[best_end : best_end + max_tokens]
        period = n - best_end
        while len(draft) < max_tokens:  # ran into the end: the span repeats
            draft.append(draft[len(draft) - period])
        return draft
