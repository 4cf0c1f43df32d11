"""The KV pool: token-slot allocator (pure Python) and the per-layer K/V tensors.

Slot 0 is reserved as a padding target and never handed out, so a usable pool of
``capacity`` slots holds ``capacity - 1`` tokens. ``req_to_token[row, i]`` is the slot of
token ``i`` of the request that owns ``row``; attention kernels read K/V through it.

``read_slots`` / ``write_slots`` move the K/V of some slots out of and into the pool as a
``KVPayload`` in the pool's own storage format: the seam the cache tiers (host memory, disk)
use, treating its arrays as opaque rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def contiguous_run(slots: list[int]) -> tuple[int, int] | None:
    """``(start, stop)`` when ``slots`` are ``start, start + 1, ..., stop - 1``, else None."""
    if not slots or slots[-1] - slots[0] != len(slots) - 1:
        return None
    return (slots[0], slots[-1] + 1) if slots == list(range(slots[0], slots[-1] + 1)) else None


@dataclass
class KVPayload:
    """The K/V of ``num_tokens`` tokens in a pool's storage format.

    ``k[layer]`` and ``v[layer]``: ``[num_tokens, kv_heads, head_dim]`` of the pool's dtype,
    token-major (row ``i`` is token ``i``). ``layout`` names the format (dtype, layers, kv
    heads, head dim): a payload goes only into a pool of the same layout. ``arrays()``: every
    array in a fixed order, each token-major, which is what ``slice`` and the byte form
    (``KVPool.payload_to_chunks`` / ``payload_from_buffer``) rely on."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    layout: str

    @property
    def num_tokens(self) -> int:
        return int(self.k[0].shape[0]) if self.k else 0

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.arrays())

    def arrays(self) -> list[torch.Tensor]:
        return [*self.k, *self.v]

    def slice(self, start: int, stop: int) -> KVPayload:
        """Tokens ``start:stop`` (views, no copy)."""
        return KVPayload([a[start:stop] for a in self.k], [a[start:stop] for a in self.v],
                         self.layout)

    @staticmethod
    def concat(parts: list[KVPayload]) -> KVPayload:
        """The tokens of ``parts`` (of one layout) one after another, in one payload."""
        if len(parts) == 1:
            return parts[0]
        return KVPayload([torch.cat(ks) for ks in zip(*(p.k for p in parts))],
                         [torch.cat(vs) for vs in zip(*(p.v for p in parts))], parts[0].layout)


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

    # ------------------------------------------------------------------ the tiers' seam
    @property
    def layout(self) -> str:
        """The storage format: dtype, layers, kv heads, head dim."""
        _, heads, dim = self.k_buffer[0].shape
        return (f"{str(self.dtype).removeprefix('torch.')}:layers={len(self.k_buffer)}:"
                f"kv_heads={heads}:head_dim={dim}")

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's K/V in this pool (all layers)."""
        _, heads, dim = self.k_buffer[0].shape
        return self.bytes_per_token(len(self.k_buffer), heads, dim, self.dtype)

    def _index(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long, device=self.device)

    def read_slots(self, slots: list[int]) -> KVPayload:
        """A copy of the K/V in ``slots`` (token ``i`` of the payload is ``slots[i]``)."""
        idx = self._index(slots)
        return KVPayload([b.index_select(0, idx) for b in self.k_buffer],
                         [b.index_select(0, idx) for b in self.v_buffer], self.layout)

    def write_slots(self, slots: list[int], payload: KVPayload) -> None:
        """Store ``payload`` (of this pool's layout, ``len(slots)`` tokens) into ``slots``."""
        if payload.layout != self.layout:
            raise ValueError(f"K/V of layout {payload.layout} cannot go into a pool of "
                             f"layout {self.layout}")
        if payload.num_tokens != len(slots):
            raise ValueError(f"{payload.num_tokens} tokens of K/V for {len(slots)} slots")
        run = contiguous_run(slots)
        idx = self._index(slots) if run is None else None
        for bufs, rows in ((self.k_buffer, payload.k), (self.v_buffer, payload.v)):
            for buf, r in zip(bufs, rows, strict=True):
                if run is not None:  # consecutive slots: a plain copy, no scatter
                    buf[run[0]:run[1]].copy_(r, non_blocking=True)
                else:
                    buf.index_copy_(0, idx, r.to(buf.device, non_blocking=True))

    def twin(self, capacity: int, device: torch.device | str = "cpu") -> KVPool:
        """A pool of the same storage format with ``capacity`` slots on ``device`` (the host
        tier's store), without a ``req_to_token`` table of its own."""
        _, heads, dim = self.k_buffer[0].shape
        return KVPool(capacity, len(self.k_buffer), heads, dim, self.dtype,
                      torch.device(device), max_running=1, max_context=1)

    def payload_to_chunks(self, payload: KVPayload) -> list[memoryview]:
        """The payload's bytes, array by array (``payload_from_buffer`` reads them back)."""
        return [memoryview(a.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")
                for a in payload.arrays()]

    def payload_from_buffer(self, buffer: bytearray | memoryview,
                            num_tokens: int) -> KVPayload:
        """A payload of this pool's layout over ``buffer`` (views, no copy), as written by
        ``payload_to_chunks``; ValueError unless it is exactly ``num_tokens`` tokens long."""
        expected = num_tokens * self.token_bytes
        if len(buffer) != expected:
            raise ValueError(f"{len(buffer)} bytes of K/V for {num_tokens} tokens of layout "
                             f"{self.layout} ({expected} expected)")
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if expected else torch.empty(0)
        _, heads, dim = self.k_buffer[0].shape
        per_array = num_tokens * heads * dim * self.k_buffer[0].element_size()
        arrays = [flat[i * per_array:(i + 1) * per_array].view(self.dtype)
                  .view(num_tokens, heads, dim) for i in range(2 * len(self.k_buffer))]
        half = len(self.k_buffer)
        return KVPayload(arrays[:half], arrays[half:], self.layout)
