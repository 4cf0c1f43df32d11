"""The KV pool: token-slot allocator (pure Python) and the per-layer K/V tensors.

Slot 0 is reserved as a padding target and never handed out, so a usable pool of
``capacity`` slots holds ``capacity - 1`` tokens. ``req_to_token[row, i]`` is the slot of
token ``i`` of the request that owns ``row``; attention kernels read K/V through it.

Storage formats (``kv_cache_dtype``): ``auto`` keeps K/V in the model's dtype; ``int8``
keeps per (token, KV head) row ``head_dim`` int8 values and one bf16 scale, symmetric
absmax (``radixlm.kernels.ref.quantize_kv``): 2 + 2/D bytes per value pair instead of 4
(bf16), so the same memory holds ~1.94x the tokens at D = 64. Every writer of K/V (the
attention backends, the native library) stores the quantized form; readers dequantize.

``read_slots`` / ``write_slots`` move the K/V of some slots out of and into the pool as a
``KVPayload`` in the pool's own storage format (for int8: the int8 rows and their scales,
kept quantized): the seam the cache tiers (host memory, disk) use, treating its arrays as
opaque rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixlm.kernels import ref
from radixlm.runtime.config import KV_CACHE_DTYPES
from radixlm.runtime.models.shape import kv_bytes_per_token


def contiguous_run(slots: list[int]) -> tuple[int, int] | None:
    """``(start, stop)`` when ``slots`` are ``start, start + 1, ..., stop - 1``, else None."""
    if not slots or slots[-1] - slots[0] != len(slots) - 1:
        return None
    return (slots[0], slots[-1] + 1) if slots == list(range(slots[0], slots[-1] + 1)) else None


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


def supported_kv_cache_dtypes(device: torch.device) -> tuple[str, ...]:
    """The ``kv_cache_dtype`` values a pool on ``device`` stores: ``auto`` and ``int8``
    everywhere. Not fp8: x86 CPUs have no fp8 conversion instructions (AVX-512 FP16 and
    AMX stop at 16 bits), so fp8 would be a software decode in the attention loop where
    int8 widens in one instruction; the GPU kernels have no fp8 variant yet."""
    return ("auto", "int8")


def check_kv_cache_dtype(name: str, device: torch.device) -> None:
    """ValueError naming the problem unless ``name`` is a format a pool on ``device``
    stores."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {' | '.join(KV_CACHE_DTYPES)}, "
                         f"got {name!r}")
    ok = supported_kv_cache_dtypes(device)
    if name not in ok:
        raise ValueError(
            f"kv_cache_dtype={name!r} is not supported on {device.type}: "
            + ("a CPU has no native fp8 conversions" if device.type == "cpu"
               else "the attention kernels have no fp8 variant")
            + f"; supported here: {' | '.join(ok)}")


@dataclass(frozen=True)
class KVPayload:
    """The K/V of ``num_tokens`` pool slots in the pool's own storage format, on the CPU.

    Per layer ``k[l]`` and ``v[l]`` ``[n, Hkv, D]`` in the pool's storage dtype and, for an
    int8 pool, ``k_scale[l]`` and ``v_scale[l]`` ``[n, Hkv]`` bf16 (empty lists
    otherwise). ``layout`` names the format (``KVPool.layout``: storage, layers, KV heads,
    head dim); a pool takes only a payload of its own layout. The arrays are the pool's
    bytes: ``write_slots(b, read_slots(a))`` makes slots ``b`` hold exactly what ``a``
    held. ``to_bytes`` / ``from_bytes`` carry a payload as one opaque byte string."""

    layout: str
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    k_scale: list[torch.Tensor]
    v_scale: list[torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return int(self.k[0].shape[0]) if self.k else 0

    def arrays(self) -> list[torch.Tensor]:
        """Every array, in the fixed order ``to_bytes`` writes them (layer by layer: K, V,
        then the K and V scales of an int8 payload)."""
        out = []
        for i in range(len(self.k)):
            out += [self.k[i], self.v[i]]
            if self.k_scale:
                out += [self.k_scale[i], self.v_scale[i]]
        return out

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.arrays())

    def slice(self, start: int, stop: int) -> KVPayload:
        """Tokens ``start .. stop - 1`` of this payload (views, no copy)."""
        def cut(xs):
            return [x[start:stop] for x in xs]

        return KVPayload(self.layout, cut(self.k), cut(self.v), cut(self.k_scale),
                         cut(self.v_scale))

    @staticmethod
    def concat(parts: list[KVPayload]) -> KVPayload:
        """The tokens of ``parts`` (of one layout) one after another, in one payload."""
        if len(parts) == 1:
            return parts[0]

        def join(field: str) -> list[torch.Tensor]:
            return [torch.cat(xs) for xs in zip(*(getattr(p, field) for p in parts))]

        return KVPayload(parts[0].layout, join("k"), join("v"), join("k_scale"),
                         join("v_scale"))

    def to_bytes(self) -> bytes:
        return b"".join(a.contiguous().view(torch.uint8).numpy().tobytes()
                        for a in self.arrays())

    @classmethod
    def from_bytes(cls, layout: str, data: bytes | bytearray | memoryview) -> KVPayload:
        """The payload ``to_bytes`` wrote for ``layout`` (ValueError if ``data`` is not a
        whole number of tokens of it)."""
        storage, layers, heads, dim = parse_layout(layout)
        quantized = storage == "int8"
        elem = torch.empty(0, dtype=_STORAGE[storage]).element_size()
        per_token = 2 * layers * heads * (dim * elem + (2 if quantized else 0))
        if len(data) % per_token:
            raise ValueError(f"{len(data)} bytes are not whole tokens of layout {layout!r} "
                             f"({per_token} bytes a token)")
        n = len(data) // per_token
        flat = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data)
                else torch.empty(0, dtype=torch.uint8))
        k, v, ks, vs, off = [], [], [], [], 0

        def take(dtype, shape):
            nonlocal off
            size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
            off += size
            return flat[off - size:off].view(dtype).view(shape)

        for _ in range(layers):
            k.append(take(_STORAGE[storage], (n, heads, dim)))
            v.append(take(_STORAGE[storage], (n, heads, dim)))
            if quantized:
                ks.append(take(torch.bfloat16, (n, heads)))
                vs.append(take(torch.bfloat16, (n, heads)))
        return cls(layout, k, v, ks, vs)


_STORAGE = {"int8": torch.int8, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float32": torch.float32}


def make_layout(storage: str, num_layers: int, num_kv_heads: int, head_dim: int) -> str:
    """``"int8/L30/H3/D64"``: the storage format and the shape of one token's K/V."""
    return f"{storage}/L{num_layers}/H{num_kv_heads}/D{head_dim}"


def parse_layout(layout: str) -> tuple[str, int, int, int]:
    """(storage, layers, KV heads, head dim) of a ``make_layout`` string."""
    try:
        storage, layers, heads, dim = layout.split("/")
        if storage not in _STORAGE or (layers[0], heads[0], dim[0]) != ("L", "H", "D"):
            raise ValueError
        return storage, int(layers[1:]), int(heads[1:]), int(dim[1:])
    except (ValueError, IndexError):
        raise ValueError(f"not a KV layout: {layout!r}") from None


class KVPool:
    """Per layer a K and a V tensor ``[capacity, num_kv_heads, head_dim]`` plus the
    ``req_to_token`` table ``[max_running, max_context]`` (int32), all on ``device``.

    ``dtype`` is what attention computes in; the buffers hold ``storage_dtype`` (``dtype``,
    or int8 with ``kv_cache_dtype="int8"``, whose ``k_scale[layer]`` / ``v_scale[layer]``
    ``[capacity, num_kv_heads]`` bf16 hold each row's scale). ``store`` writes K/V in the
    pool's format, ``rows`` reads them back as ``dtype``; ``read_slots`` / ``write_slots``
    move the stored bytes themselves."""

    def __init__(self, capacity: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, max_running: int,
                 max_context: int, kv_cache_dtype: str = "auto") -> None:
        check_kv_cache_dtype(kv_cache_dtype, torch.device(device))
        self.capacity = capacity
        self.dtype, self.device = dtype, device
        self.kv_cache_dtype = kv_cache_dtype
        self.quantized = kv_cache_dtype == "int8"
        self.storage_dtype = torch.int8 if self.quantized else dtype
        shape = (capacity, num_kv_heads, head_dim)
        self.layout = make_layout(str(self.storage_dtype).removeprefix("torch."), num_layers,
                                  num_kv_heads, head_dim)

        def buffers(shape, dtype):
            return [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]

        # empty, not zeros: pages are committed only as slots get used. Slot 0 (padding) is
        # zeroed because masked attention positions still read it (0 * NaN would be NaN).
        self.k_buffer = buffers(shape, self.storage_dtype)
        self.v_buffer = buffers(shape, self.storage_dtype)
        scale_shape = (capacity, num_kv_heads)
        self.k_scale = buffers(scale_shape, torch.bfloat16) if self.quantized else []
        self.v_scale = buffers(scale_shape, torch.bfloat16) if self.quantized else []
        for buf in self.k_buffer + self.v_buffer + self.k_scale + self.v_scale:
            buf[0].zero_()
        self.req_to_token = torch.zeros((max_running, max_context), dtype=torch.int32,
                                        device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
        """Bytes of one token's K/V (all layers) in the format ``kv_cache_dtype``."""
        return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype, kv_cache_dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the K/V buffers (and scales)."""
        bufs = self.k_buffer + self.v_buffer + self.k_scale + self.v_scale
        return sum(b.numel() * b.element_size() for b in bufs)

    # ------------------------------------------------------------------ K/V in the format
    def store(self, layer: int, loc: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [T, Hkv, D]`` at slots ``loc`` of ``layer``; returns the K/V as
        attention reads them back (for int8, ``k, v`` quantized and dequantized as
        ``dtype``), so a step attends to its own tokens as later steps will."""
        if not self.quantized:
            self.k_buffer[layer][loc] = k  # index_put casts if the pool dtype differs
            self.v_buffer[layer][loc] = v
            return k, v
        seen = []
        for cache, scales, x in ((self.k_buffer[layer], self.k_scale[layer], k),
                                 (self.v_buffer[layer], self.v_scale[layer], v)):
            q, s = ref.quantize_kv(x)
            cache[loc], scales[loc] = q, s
            seen.append(ref.dequantize_kv(q, s, x.dtype))
        return seen[0], seen[1]

    def rows(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``slots`` (any shape of int64 indices) in ``layer`` as ``dtype``."""
        k, v = self.k_buffer[layer][slots], self.v_buffer[layer][slots]
        if not self.quantized:
            return k, v
        return (ref.dequantize_kv(k, self.k_scale[layer][slots], self.dtype),
                ref.dequantize_kv(v, self.v_scale[layer][slots], self.dtype))

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(k_scale, v_scale)`` of ``layer`` for the kernels (None, None: not int8)."""
        if not self.quantized:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    # ------------------------------------------------------------------ the tiers' seam
    @property
    def token_bytes(self) -> int:
        """Bytes of one token's K/V in this pool (all layers, scales included)."""
        _, heads, dim = self.k_buffer[0].shape
        return self.bytes_per_token(len(self.k_buffer), heads, dim, self.dtype,
                                    self.kv_cache_dtype)

    def read_slots(self, slots: list[int]) -> KVPayload:
        """The stored K/V of ``slots`` (every layer) as a CPU ``KVPayload`` in this pool's
        format (int8 rows and their scales for an int8 pool); the pool is not changed."""
        run = contiguous_run(slots)
        idx = (None if run is not None
               else torch.tensor(slots, dtype=torch.int64, device=self.device))

        def gather(bufs):
            if run is not None:  # consecutive slots: a plain copy, no gather
                return [b[run[0]:run[1]].clone().cpu() for b in bufs]
            return [b.index_select(0, idx).cpu() for b in bufs]

        return KVPayload(self.layout, gather(self.k_buffer), gather(self.v_buffer),
                         gather(self.k_scale), gather(self.v_scale))

    def write_slots(self, slots: list[int], payload: KVPayload) -> None:
        """Put ``payload`` (of this pool's ``layout``, one token per slot) into ``slots``
        of every layer, byte for byte. ValueError for another layout or a count mismatch."""
        if payload.layout != self.layout:
            raise ValueError(f"KV payload layout {payload.layout!r} does not match this "
                             f"pool's {self.layout!r}")
        if payload.num_tokens != len(slots):
            raise ValueError(f"KV payload holds {payload.num_tokens} tokens for "
                             f"{len(slots)} slots")
        if not slots:
            return
        run = contiguous_run(slots)
        idx = (None if run is not None
               else torch.tensor(slots, dtype=torch.int64, device=self.device))
        for bufs, parts in ((self.k_buffer, payload.k), (self.v_buffer, payload.v),
                            (self.k_scale, payload.k_scale), (self.v_scale, payload.v_scale)):
            for buf, part in zip(bufs, parts, strict=True):
                if run is not None:  # consecutive slots: a plain copy, no scatter
                    buf[run[0]:run[1]].copy_(part)
                else:
                    buf.index_copy_(0, idx, part.to(self.device))

    def twin(self, capacity: int, device: torch.device | str = "cpu") -> KVPool:
        """A pool of the same storage format (``kv_cache_dtype`` included: an int8 pool's
        twin keeps int8 rows and scales) with ``capacity`` slots on ``device`` (the host
        tier's store), without a ``req_to_token`` table of its own."""
        _, heads, dim = self.k_buffer[0].shape
        return KVPool(capacity, len(self.k_buffer), heads, dim, self.dtype,
                      torch.device(device), max_running=1, max_context=1,
                      kv_cache_dtype=self.kv_cache_dtype)
