"""The KV pool: token-slot allocator (pure Python) and the per-layer K/V tensors.

Slot 0 is reserved as a padding target and never handed out, so a usable pool of
``capacity`` slots holds ``capacity - 1`` tokens. ``req_to_token[row, i]`` is the slot of
token ``i`` of the request that owns ``row``; attention kernels read K/V through it.
"""

from __future__ import annotations

import torch


class SlotAllocator:
    """Free list of token slots. LIFO reuse keeps recently freed (cache-warm) slots hot;
    a fresh pool hands out ascending, contiguous runs."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[int] = list(range(capacity - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usable(self) -> int:
        return self.capacity - 1

    def alloc(self, n: int) -> list[int] | None:
        """``n`` slots, or None (nothing taken) if fewer are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        out.reverse()
        return out

    def free(self, slots: list[int]) -> None:
        self._free.extend(reversed(slots))

    def free_slots(self) -> list[int]:
        return list(self._free)

    def reset(self) -> None:
        self._free = list(range(self.capacity - 1, 0, -1))


class RowAllocator:
    """Rows of ``req_to_token``: one per running (or chunk-prefilling) request."""

    def __init__(self, num_rows: int) -> None:
        self._free = list(range(num_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        self._free.append(row)


class KVPool:
    """Per layer a K and a V tensor ``[capacity, num_kv_heads, head_dim]`` plus the
    ``req_to_token`` table ``[max_running, max_context]`` (int32), all on ``device``."""

    def __init__(self, capacity: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, max_running: int,
                 max_context: int) -> None:
        self.capacity = capacity
        self.dtype, self.device = dtype, device
        shape = (capacity, num_kv_heads, head_dim)
        # empty, not zeros: pages are committed only as slots get used. Slot 0 (padding) is
        # zeroed because masked attention positions still read it (0 * NaN would be NaN).
        self.k_buffer = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        for buf in self.k_buffer + self.v_buffer:
            buf[0].zero_()
        self.req_to_token = torch.zeros((max_running, max_context), dtype=torch.int32,
                                        device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
