"""How many tokens a request drafts next, from its own acceptance history. Pure Python.

The rule (one ``DraftBudget`` per request and draft source):

- **Length.** Starts at ``initial``. A draft accepted in full doubles it (twice the drafted
  count, never less than before: a short draft capped by the caller says nothing against
  the length); one accepted in
  part sets it to the accepted count plus one (the model agreed that far, so the next
  draft aims just past it); one rejected outright halves it. Always within
  ``[1, max_tokens]``.
- **Stopping.** ``patience`` drafts in a row rejected outright pause drafting for
  ``pause_tokens`` tokens of the sequence's growth; each further pause that follows
  without an accepted token in between lasts twice as long, up to ``max_pause_tokens``.
  After a pause the request probes again with a one-token draft. A draft with at least
  one accepted token clears the streak and restores the first pause length.

Pauses are counted in tokens the sequence grew, not in calls, so they end however often
the scheduler asks (it may skip drafting at large batches).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftPolicy:
    """Bounds of the per-request rule above."""

    max_tokens: int = 8
    initial: int = 4
    patience: int = 4
    pause_tokens: int = 8
    max_pause_tokens: int = 512

    def __post_init__(self) -> None:
        for name in ("max_tokens", "initial", "patience", "pause_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"DraftPolicy.{name} must be >= 1, got {getattr(self, name)}")
        if self.initial > self.max_tokens:
            raise ValueError(f"DraftPolicy.initial ({self.initial}) must not exceed "
                             f"max_tokens ({self.max_tokens})")
        if self.max_pause_tokens < self.pause_tokens:
            raise ValueError(f"DraftPolicy.max_pause_tokens ({self.max_pause_tokens}) must "
                             f"be >= pause_tokens ({self.pause_tokens})")


class DraftBudget:
    """One request's state under a ``DraftPolicy``."""

    __slots__ = ("policy", "length", "misses", "pause", "resume_at")

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy
        self.length = policy.initial
        self.misses = 0  # drafts in a row rejected outright
        self.pause = policy.pause_tokens  # length of the next pause
        self.resume_at = 0  # sequence length from which drafting is allowed again

    def allowed(self, seq_len: int) -> int:
        """Draft tokens allowed now, when the sequence has ``seq_len`` tokens (0: paused)."""
        return 0 if seq_len < self.resume_at else self.length

    def paused(self, seq_len: int) -> bool:
        return seq_len < self.resume_at

    def update(self, drafted: int, accepted: int, seq_len: int) -> None:
        """A verification of ``drafted`` tokens accepted ``accepted`` of them; ``seq_len``
        is the sequence length when the draft was made."""
        if drafted <= 0:
            return
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted tokens")
        p = self.policy
        if accepted:
            self.misses, self.pause = 0, p.pause_tokens
            grown = max(self.length, 2 * drafted) if accepted == drafted else accepted + 1
            self.length = max(1, min(p.max_tokens, grown))
            return
        self.length = max(1, self.length // 2)
        self.misses += 1
        if self.misses >= p.patience:
            self.resume_at = seq_len + self.pause
            self.pause = min(2 * self.pause, p.max_pause_tokens)
            self.misses, self.length = 0, 1
