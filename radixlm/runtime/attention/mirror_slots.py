"""Which mirror slot holds which request's K/V (pure Python; the torch backend moves data).

The torch attention backend keeps a dense copy of each running request's K/V in one of a
fixed number of *slots*. This class only decides: a slot for every request of a step, and
for a decode step the requests packed into slots ``0 .. B-1`` so the step is one SDPA call
with no holes. It returns the moves (source slot, destination slot, tokens to copy) for
the caller to perform, and tracks how many positions of each slot are up to date.
"""

from __future__ import annotations


class MirrorSlots:
    def __init__(self, num_slots: int) -> None:
        """``num_slots`` >= the largest batch (one per ``req_to_token`` row)."""
        self.num_slots = num_slots
        self.owner: list[int | None] = [None] * num_slots  # request uid per slot
        self.slot_of: dict[int, int] = {}
        self.valid = [0] * num_slots  # positions [0, valid) of the slot are up to date
        self.last_used = [0] * num_slots  # step counter, for LRU reuse
        self.steps = 0
        self.moves = 0  # total moves handed out (stats)

    def place(self, owners: list[int], compact: bool) -> tuple[list[int], list[tuple]]:
        """Slot of each request of the step, and the moves ``(src, dst, n)`` to perform
        first (copy positions ``[0, n)`` of slot ``src`` to ``dst``). A request without a
        slot gets a free one, else the least recently used slot of a request not in this
        step (a request that comes back later is refilled from the pool: its ``valid`` is
        0). With ``compact`` every request ends in a slot below ``len(owners)``."""
        if len(owners) > self.num_slots:  # a caller bug: batches are at most one per row
            raise RuntimeError(f"{len(owners)} requests in a step, {self.num_slots} slots")
        keep = set(owners)
        bound = len(owners) if compact else self.num_slots
        self.steps += 1
        slots, moves = [], []
        for owner in owners:
            slot = self.slot_of.get(owner)
            if slot is None:
                slot = self._pick(bound, keep)
                self._assign(slot, owner)
            elif slot >= bound:
                new, n = self._pick(bound, keep), self.valid[slot]
                self._assign(new, owner)
                self.valid[new] = n
                self.owner[slot], self.valid[slot] = None, 0
                moves.append((slot, new, n))
                self.moves += 1
                slot = new
            self.last_used[slot] = self.steps
            slots.append(slot)
        return slots, moves

    def _pick(self, below: int, keep: set) -> int:
        best = None
        for slot in range(below):
            owner = self.owner[slot]
            if owner is None:
                return slot
            if owner not in keep and (best is None
                                      or self.last_used[slot] < self.last_used[best]):
                best = slot
        assert best is not None  # below >= len(keep), and this owner holds no slot below
        return best

    def _assign(self, slot: int, owner: int) -> None:
        old = self.owner[slot]
        if old is not None:
            del self.slot_of[old]
        self.owner[slot], self.slot_of[owner], self.valid[slot] = owner, slot, 0
