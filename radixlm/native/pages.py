"""A file mapping's pages: faulted in at once before a copy, given back after it.

A GGUF's tensors are read from a read-only map of the file and copied once into the native
library's arena. Each page the copy touched stays in the process's resident set for as long
as the map lives, so without this a model counted twice in memory while it loaded. ``release``
drops the pages of an array that lies in a file map (``MADV_DONTNEED``: the data stays in the
file and the page cache; touching the array again faults it back in); other arrays are left
alone. ``populate`` asks the kernel to map a range's pages in one call (``MADV_POPULATE_READ``
for a file map about to be read, ``MADV_POPULATE_WRITE`` for fresh memory about to be
written): on the 2-core VMs a page fault cost ~6 us, and faulting a 0.67 GB model in page by
page (the file map read, the arena written) took 2.7 s of a 6 s load; populated, 0.4 s.
``huge`` and ``collapse`` put the arena on 2 MiB pages: asked for before the first touch,
or moved there after it where the kernel has ``MADV_COLLAPSE`` (``arena.Arena.settle``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import mmap
import threading
import time

import numpy as np

MADV_DONTNEED, MADV_HUGEPAGE = 4, 14  # <sys/mman.h> on Linux
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23  # Linux 5.14+
MADV_COLLAPSE = 25  # Linux 6.1+
COLLAPSE_CHUNK = 32 << 20  # bytes a ``collapse`` call: the map's lock held that long at most
COLLAPSE_TRIES = 4  # calls a chunk the kernel answers EAGAIN (a transient failure) gets
PARALLEL_MIN = 64 << 20  # bytes a thread, at least, for ``populate`` to split a range


@functools.lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


def file_mapped(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a file map (np.memmap or a mmap object)."""
    base = a
    while base is not None:
        if isinstance(base, np.memmap) or isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def _span(a: np.ndarray) -> tuple[int, int]:
    """The bytes ``[start, end)`` that ``a`` (contiguous or a strided view) lies in."""
    from numpy.lib.array_utils import byte_bounds

    return byte_bounds(a)


def whole_pages(a: np.ndarray) -> tuple[int, int]:
    """The whole pages inside ``a``'s span, ``[lo, hi)`` (``hi <= lo``: none)."""
    page = mmap.PAGESIZE
    start, end = _span(a)
    return -(-start // page) * page, end // page * page


def release(a: np.ndarray | None) -> int:
    """Drop the whole pages inside ``a``'s span from this process's resident set if ``a``
    lies in a file map (a strided view: the pages between its elements too); returns the
    bytes released (0 for anything else, or where madvise is not to be had). The array stays
    valid: its pages fault back in from the file if read."""
    libc = _libc()
    if a is None or libc is None or not file_mapped(a):
        return 0
    lo, hi = whole_pages(a)
    if hi <= lo:
        return 0
    return hi - lo if libc.madvise(lo, hi - lo, MADV_DONTNEED) == 0 else 0


def huge(address: int, size: int) -> bool:
    """Ask for transparent huge pages over ``[address, address + size)`` (``MADV_HUGEPAGE``;
    call before the range is touched). False where libc cannot; where the kernel has THP
    off it is a no-op. A decode step streams every weight once, and on 4 KiB pages it pays a
    TLB miss every 4 KiB: on the Ice Lake VM (``bench_decode_step``, alternating pairs in one
    tree) a 1B Q4_K_M step took 33.5-39.8 ms on 2 MiB pages against 37.7-45.8 ms on 4 KiB
    ones (7 of 7 pairs faster), an 8B Q4_K_M step 231-247 ms against 262-283 ms. The cost is
    at the first touch: 0.05-0.08 s for 0.7 GB where free huge pages are to be had, up to
    0.5 s (0.7 GB) or 2 s (4.6 GB) where the kernel compacts memory first."""
    libc = _libc()
    return libc is not None and size > 0 and libc.madvise(address, size, MADV_HUGEPAGE) == 0


@functools.lru_cache(maxsize=1)
def can_collapse() -> bool:
    """Whether this kernel takes ``MADV_COLLAPSE`` (tried once on a 2 MiB page of a map of
    its own: EINVAL is a kernel without it, or with transparent huge pages off)."""
    libc = _libc()
    if libc is None:
        return False
    with mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE) as probe:
        raw = np.frombuffer(probe, dtype=np.uint8)
        start = raw.ctypes.data + (-raw.ctypes.data) % (2 << 20)
        ok = (populate(start, 2 << 20, write=True)
              and (libc.madvise(start, 2 << 20, MADV_COLLAPSE) == 0
                   or ctypes.get_errno() not in (22, 38)))  # EINVAL, ENOSYS
        del raw
    return ok


def collapse(address: int, size: int, stop: threading.Event | None = None) -> int:
    """Move ``[address, address + size)`` (populated, 2 MiB aligned) onto transparent huge
    pages now, ``COLLAPSE_CHUNK`` bytes a call (``MADV_COLLAPSE``: the kernel copies each
    2 MiB run of 4 KiB pages into a huge page; the addresses and the data stay). Returns the
    bytes the kernel collapsed (a chunk it cannot, e.g. no free huge page to be had, stays on
    4 KiB pages); stops early once ``stop`` is set. Where a start would otherwise wait for
    the kernel to compact memory for huge pages at the first touch (``huge``), this lets the
    weights be written on 4 KiB pages and moved after the engine is ready."""
    libc = _libc()
    done = 0
    if libc is None or not can_collapse():
        return 0
    for lo in range(address, address + size, COLLAPSE_CHUNK):
        if stop is not None and stop.is_set():
            break
        n = min(COLLAPSE_CHUNK, address + size - lo)
        for _ in range(COLLAPSE_TRIES):  # (EAGAIN: a page busy elsewhere for a moment)
            if libc.madvise(lo, n, MADV_COLLAPSE) == 0:
                done += n
                break
            if ctypes.get_errno() != errno.EAGAIN:
                break
            time.sleep(0.001)
    return done


def populate(address: int, size: int, write: bool, threads: int = 1) -> bool:
    """Map the pages of ``[address, address + size)`` now (``write``: for writing, e.g. fresh
    anonymous memory; else for reading, e.g. a file map). False where the kernel or libc
    cannot (the pages then fault in as they are touched: slower, the same result).

    With ``threads`` > 1 a range of at least ``PARALLEL_MIN`` bytes a thread is split into
    that many parts, each mapped by a thread of its own (madvise drops the GIL): fresh
    memory on the 2-core VMs, 4 GiB, 1.4-2.2 s on one thread, 0.67 s on two."""
    libc = _libc()
    if libc is None or size <= 0:
        return False
    page = mmap.PAGESIZE
    lo = address // page * page
    hi = -(-(address + size) // page) * page
    advice = MADV_POPULATE_WRITE if write else MADV_POPULATE_READ
    parts = max(1, min(threads, (hi - lo) // PARALLEL_MIN))
    if parts == 1:
        return libc.madvise(lo, hi - lo, advice) == 0
    cut = [lo + (hi - lo) // parts * i // page * page for i in range(parts)] + [hi]
    ok = [False] * parts

    def part(i: int) -> None:
        ok[i] = libc.madvise(cut[i], cut[i + 1] - cut[i], advice) == 0

    helpers = [threading.Thread(target=part, args=(i,)) for i in range(1, parts)]
    for t in helpers:
        t.start()
    part(0)
    for t in helpers:
        t.join()
    return all(ok)


def populate_read(a: np.ndarray | None) -> bool:
    """``populate`` for reading ``a``'s span where it lies in a file map (False for anything
    else)."""
    if a is None or not file_mapped(a):
        return False
    start, end = _span(a)
    return populate(start, end - start, write=False)
