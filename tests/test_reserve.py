"""The native arena's memory filled ahead (radixlm/native/reserve.py): what a reservation
holds, who takes it, what it leaves, and that a start's pool and checks count it."""

from __future__ import annotations

import numpy as np
import pytest

from radixlm.native import reserve

MB = 1 << 20


def _resident(buf: np.ndarray) -> int:
    """Bytes of ``buf``'s pages resident (mincore)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = buf.ctypes.data // page * page
    n = -(-(buf.ctypes.data + buf.nbytes - start) // page)
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(n * page), vec) == 0
    return sum(v & 1 for v in vec) * page


@pytest.fixture(autouse=True)
def _no_leftover():
    yield
    reserve.drop()


def test_a_reservation_is_taken_aligned_and_filled_to_its_fill():
    """``take`` returns the map's first ``size`` bytes on a 2 MB boundary, its first
    ``fill`` bytes resident and zero, the filled bytes past ``size`` given back; a second
    ``take`` finds nothing (one taker)."""
    assert reserve.reserve(64 * MB, 24 * MB)
    assert reserve.filled_bytes() == 24 * MB
    got = reserve.take(16 * MB)
    assert got is not None
    _, buf = got
    assert buf.nbytes == 16 * MB and buf.ctypes.data % (2 * MB) == 0
    assert _resident(buf) == 16 * MB and not buf.any()
    tail = np.frombuffer(got[0], dtype=np.uint8)
    start = buf.ctypes.data - tail.ctypes.data
    assert _resident(tail[start + 16 * MB:start + 24 * MB]) == 0
    buf[:] = 7  # (the taker's to write)
    assert reserve.take(1) is None and reserve.filled_bytes() == 0


def test_a_reservation_too_small_is_dropped_and_none_is_made_past_available(monkeypatch):
    assert reserve.reserve(4 * MB, 4 * MB)
    assert reserve.take(8 * MB) is None and reserve.filled_bytes() == 0
    monkeypatch.setattr(reserve, "available_memory", lambda: 2 * MB)
    assert not reserve.reserve(64 * MB, 3 * MB)  # (a fill past what is available: none)
    assert reserve.filled_bytes() == 0 and reserve.take(1) is None


def test_a_gguf_start_fills_its_arena_ahead_and_sizes_the_pool_alike(tmp_path, monkeypatch):
    """An engine on a GGUF read natively: its arena is the reservation (nothing of it left
    afterwards), and its KV pool, sized from the memory available, is the one a start
    without the reservation sizes (the filled bytes count as available). Without the
    native library nothing is reserved."""
    from test_native_kquants import write_tiny_gguf

    from radixlm.runtime import model_runner
    from radixlm.runtime.engine import Engine

    path = write_tiny_gguf(tmp_path / "tiny.gguf", "tiny", lambda t: "Q4_K")
    free = 1 << 31
    monkeypatch.setattr(model_runner, "available_memory", lambda: free - reserve.filled_bytes()
                        if reserve._held is not None else free)
    pools = []
    for ahead in (True, False):
        if not ahead:
            monkeypatch.setattr(model_runner, "reserve_arena", lambda config, path: False)
            monkeypatch.setattr("radixlm.runtime.engine.reserve_arena",
                                lambda config, path: False)
        with Engine(str(path), log_level="warning") as engine:
            assert engine.runner.native.arena.reserved == ahead
            assert reserve._held is None
            pools.append(engine.runner.pool.capacity)
            out = engine.generate("Hello", {"max_new_tokens": 4, "temperature": 0})
            assert out["meta_info"]["completion_tokens"] == 4
    assert pools[0] == pools[1]
    monkeypatch.setenv("RADIXLM_NATIVE", "0")
    from radixlm.runtime.config import EngineConfig

    assert not model_runner.reserve_arena(EngineConfig(model=str(path)), path)
