"""Test helpers for speculative decoding: a drafter that proposes a known continuation
(whole, corrupted, or wrong), step costs that make every draft pay, and a walk over the
radix tree's sequences."""

from __future__ import annotations

from radixlm.runtime.speculative.cost import StepCosts


class ScriptedDrafter:
    """Proposes, for a request whose output so far follows ``scripts[rid]``, the script's
    next tokens; ``mode``: "exact", "corrupt" (every third script position off by one) or
    "wrong" (every token off by one). ``tail`` is appended past the script's end (tokens a
    draft may carry beyond EOS). Records what the scheduler told it."""

    def __init__(self, scripts: dict[str, list[int]], mode: str = "exact",
                 tail: list[int] | None = None, vocab: int = 49152) -> None:
        self.scripts, self.mode, self.tail, self.vocab = scripts, mode, tail or [], vocab
        self.observed: list[tuple[str, int, int]] = []
        self.released: list[str] = []
        self.proposed = 0

    def _token(self, pos: int, tok: int) -> int:
        off = self.mode == "wrong" or (self.mode == "corrupt" and pos % 3 == 2)
        return (tok + 1) % self.vocab if off else tok

    def propose(self, req, max_tokens: int) -> list[int]:
        script = self.scripts.get(req.rid)
        n = len(req.output_ids)
        if script is None or req.output_ids != script[:n] or max_tokens <= 0:
            return []
        full = script + self.tail
        draft = [self._token(n + j, t) for j, t in enumerate(full[n:n + max_tokens])]
        self.proposed += len(draft)
        return draft

    def observe(self, req, num_drafted: int, num_accepted: int) -> None:
        assert 0 <= num_accepted <= num_drafted
        self.observed.append((req.rid, num_drafted, num_accepted))

    def release(self, req) -> None:
        self.released.append(req.rid)


class FreeDrafts(StepCosts):
    """Step costs under which every extra token is free: each step takes every draft
    token the requests can use (to test the mechanics, not the decision)."""

    def estimate(self, tokens: int, drafted: bool) -> float:
        return 1.0


def use_drafter(engine, drafter, free: bool = True):
    """Put ``drafter`` into a speculating engine (``None``: speculation off); with
    ``free``, drafts are always taken."""
    spec = engine.scheduler.speculation
    spec.drafter = drafter
    if free:
        spec.costs = FreeDrafts()
    return spec


def tree_sequences(cache) -> list[list[int]]:
    """Every root-to-leaf token sequence of a radix cache."""
    out, stack = [], [(cache._root, [])]
    while stack:
        node, prefix = stack.pop()
        seq = prefix + list(node.key)
        children = list(node.children.values())
        if not children and seq:
            out.append(seq)
        stack.extend((c, seq) for c in children)
    return out


def assert_tree_holds_only(cache, sequences: list[list[int]]) -> None:
    """Every sequence in the tree is a prefix of one of ``sequences`` (prompt + output
    of the requests that ran): no draft token the model rejected was ever cached."""
    for seq in tree_sequences(cache):
        assert any(seq == s[:len(seq)] for s in sequences), f"stale tree entry {seq[-8:]}"
