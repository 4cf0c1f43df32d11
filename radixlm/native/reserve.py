"""Fresh memory for the native arena, mapped and filled while the start does other work.

A GGUF's arena (``ops.Arena``: every block weight in one anonymous map, on huge pages) is
filled by the kernel before the weights are copied in: 0.3-0.6 s for a 1B model's 0.65 GB on
the 2-core VMs (page faults, zeroing, compaction for 2 MB pages), all of it in ``madvise``
with the GIL released. ``reserve`` starts that work on a thread of its own as soon as the
file's size is known, so it runs beside the config's imports (Python, on the other core);
the arena ``take``s the map if it is large enough, else makes its own. Memory is filled only
where it is available now: a model too large for this machine is refused later, with the
numbers, by the runner (``filled_bytes`` tells it what the reservation already holds).
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from radixlm.native import pages

HUGE = 2 << 20  # the arena's alignment: a huge page


def available_memory() -> int:
    """Bytes of memory available to this process: ``MemAvailable`` (free + reclaimable
    page cache), bounded by a cgroup limit where one is set."""
    avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    for path, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),):
        try:
            limit = open(path).read().strip()
            if limit != "max":
                avail = min(avail, int(limit) - int(open(used).read()))
        except (OSError, ValueError):
            pass
    return avail


class _Reservation:
    def __init__(self, size: int, fill: int) -> None:
        self.map = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE)
        raw = np.frombuffer(self.map, dtype=np.uint8)
        start = (-raw.ctypes.data) % HUGE
        self.buf, self.fill = raw[start:start + size], fill
        pages.huge(self.buf.ctypes.data, -(-size // HUGE) * HUGE)
        self.thread = threading.Thread(target=_fill, args=(self.buf.ctypes.data, fill),
                                       name="radixlm-reserve", daemon=True)
        self.thread.start()


CHUNK = 2 << 20


def _fill(address: int, size: int) -> None:
    """``pages.populate`` a chunk at a time: a populate holds the process's map lock, which
    the imports beside it need to map their libraries and memory."""
    for at in range(0, size, CHUNK):
        pages.populate(address + at, min(CHUNK, size - at), write=True)


_lock = threading.Lock()
_held: _Reservation | None = None


def reserve(size: int, fill: int) -> bool:
    """Map ``size`` bytes of fresh memory (2 MB aligned, huge pages asked) and populate its
    first ``fill`` on a thread of its own; replaces an earlier reservation. False (nothing
    mapped) where ``fill`` is more than the memory available now or the map fails."""
    global _held
    drop()
    fill = max(0, min(fill, size))
    if fill > available_memory():
        return False
    try:
        held = _Reservation(size, fill)
    except (OSError, ValueError, OverflowError):
        return False
    with _lock:
        _held = held
    return True


def _wait() -> _Reservation | None:
    with _lock:
        held = _held
    if held is not None:
        held.thread.join()
    return held


def filled_bytes() -> int:
    """Bytes of memory the reservation holds (waiting for its fill): available to the
    arena that takes it, no longer counted in ``MemAvailable``. 0 without one."""
    held = _wait()
    return 0 if held is None else held.fill


def take(size: int) -> tuple[mmap.mmap, np.ndarray] | None:
    """The reservation's map and its first ``size`` bytes (2 MB aligned), its fill waited
    for and the filled bytes past ``size`` given back, where it holds ``size``; else None
    (and it is dropped). Its one taker owns the map from then on."""
    global _held
    held = _wait()
    with _lock:
        _held = None
    if held is None:
        return None
    if held.buf.nbytes < size:
        _close(held)
        return None
    if held.fill > size:  # (the kernel frees them: the map is private and anonymous)
        pages.discard(held.buf.ctypes.data + size, held.fill - size)
    return held.map, held.buf[:size]


def drop() -> None:
    """Unmap the reservation no arena took (idempotent)."""
    global _held
    held = _wait()
    with _lock:
        _held = None
    if held is not None:
        _close(held)


def _close(held: _Reservation) -> None:
    held.buf = None  # (the one array over the map, exported from it)
    try:
        held.map.close()
    except BufferError:  # (a view still over it: the map goes with the view)
        pass
