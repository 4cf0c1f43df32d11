"""The host tier's store: a second pool of the KV pool's own storage format in host memory.

Evicted radix nodes keep their K/V here (``demote``: pool slots -> host slots) and come
back from here (``load``: host slots -> pool slots) through the pool's ``read_slots`` /
``write_slots`` seam, so the copies are in whatever format the pool stores (quantized
when it is). On a CPU the device pool and this store are the same RAM: the store is
outside the pool's capacity, allocated once at its full size and committed by the OS as
it fills, so its memory is bounded by construction and never fragments.
"""

from __future__ import annotations

from radixlm.runtime.kv_pool import KVPool, SlotAllocator


class HostTier:
    """Implements ``radix.HostStore`` for the tiered tree, over a twin of ``pool``.

    ``capacity``: host slots (tokens). Counters (monotonic): ``demoted_tokens`` /
    ``loaded_tokens`` copied in and out."""

    def __init__(self, pool: KVPool, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the host tier needs at least one token, got {capacity}")
        self.device_pool = pool
        self.store = pool.twin(capacity + 1)  # slot 0 stays unused, as in the pool
        self._slots = SlotAllocator(capacity + 1)
        self.token_bytes = pool.token_bytes
        self.demoted_tokens = 0
        self.loaded_tokens = 0

    @property
    def capacity(self) -> int:
        return self._slots.usable

    @property
    def num_free(self) -> int:
        return self._slots.num_free

    @property
    def capacity_bytes(self) -> int:
        return self.capacity * self.token_bytes

    def demote(self, slots: list[int]) -> list[int] | None:
        """Copy the K/V of pool ``slots`` into newly taken host slots (None if too few)."""
        host = self._slots.alloc(len(slots))
        if host is None:
            return None
        self.store.write_slots(host, self.device_pool.read_slots(slots))
        self.demoted_tokens += len(slots)
        return host

    def free(self, host_slots: list[int]) -> None:
        self._slots.free(host_slots)

    def load(self, host_slots: list[int], slots: list[int]) -> None:
        """Copy the K/V held in ``host_slots`` into pool ``slots`` (the host slots stay the
        caller's until it frees them)."""
        self.device_pool.write_slots(slots, self.store.read_slots(host_slots))
        self.loaded_tokens += len(slots)

    def free_slots(self) -> list[int]:
        return self._slots.free_slots()
