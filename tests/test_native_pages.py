"""A file map's pages (radixlm/native/pages.py): populated in one call before the arena's
copy reads them, given back after it; fresh memory populated before it is written; the
arena on huge pages, moved there after it is written where the kernel can."""

from __future__ import annotations

import errno
import mmap

import numpy as np
import pytest

from radixlm.native import pages


def _rss_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _rss_file_kb() -> int:
    return _rss_kb("RssFile")


@pytest.fixture
def mapped(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8))
    return np.memmap(path, dtype=np.uint8, mode="r")


def test_populate_read_maps_a_file_maps_pages_and_release_gives_them_back(mapped):
    before = _rss_file_kb()
    assert pages.populate_read(mapped[4096:])  # (Linux 5.14+: the test hosts' kernels)
    grown = _rss_file_kb() - before
    assert grown >= 60 << 10  # ~64 MB resident without touching a byte
    assert pages.release(mapped) >= (64 << 20) - 4096
    assert _rss_file_kb() - before < 4 << 10
    assert int(mapped[12345]) == int(np.fromfile(mapped.filename, np.uint8, 1, offset=12345)[0])


def test_populate_read_leaves_memory_that_is_not_a_file_map_alone():
    assert not pages.populate_read(np.zeros(1 << 20, dtype=np.uint8))
    assert not pages.populate_read(None)


def test_populate_write_maps_fresh_memory():
    m = mmap.mmap(-1, 32 << 20)
    buf = np.frombuffer(m, dtype=np.uint8)
    before = _rss_kb("VmRSS")  # (an anonymous shared map, as the arena's: RssShmem)
    assert pages.populate(buf.ctypes.data, buf.nbytes, write=True)
    assert _rss_kb("VmRSS") - before >= 30 << 10
    assert not buf.any()  # zero pages, as a fault would give
    del buf
    m.close()


def test_populate_on_threads_maps_every_part_of_the_range(monkeypatch):
    """Split over threads, every part is mapped: the whole range resident, the split at
    page boundaries with nothing left out (an unaligned start and end included)."""
    monkeypatch.setattr(pages, "PARALLEL_MIN", 4 << 20)  # (a small range still splits)
    m = mmap.mmap(-1, 24 << 20, flags=mmap.MAP_PRIVATE)
    buf = np.frombuffer(m, dtype=np.uint8)
    seen: list[tuple[int, int]] = []
    madvise = pages._libc().madvise

    class Spy:
        def madvise(self, address, length, advice):
            seen.append((address, length))
            return madvise(address, length, advice)

    monkeypatch.setattr(pages, "_libc", lambda: Spy())
    before = _rss_kb("VmRSS")
    start, size = buf.ctypes.data + 100, buf.nbytes - 5000
    assert pages.populate(start, size, write=True, threads=3)
    assert len(seen) == 3  # three parts, one madvise each
    seen.sort()
    page = mmap.PAGESIZE
    assert seen[0][0] == start // page * page
    assert all(a + n == b for (a, n), (b, _) in zip(seen, seen[1:]))  # no gap, no overlap
    assert seen[-1][0] + seen[-1][1] == -(-(start + size) // page) * page
    assert all(a % page == 0 and n % page == 0 for a, n in seen)
    assert _rss_kb("VmRSS") - before >= 22 << 10
    assert not buf.any()
    del buf
    m.close()


def _smaps(address: int, field: str) -> list[str]:
    """``field`` of the mapping ``address`` lies in (/proc/self/smaps): its words."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == field + ":":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _thp_eligible(address: int) -> bool:
    return _smaps(address, "THPeligible") == ["1"]


def _q8_weight(rows: int):
    from radixlm.native.qweights import FMT_Q8, QWeight

    rng = np.random.default_rng(1)
    qs = rng.integers(-127, 128, (rows, 2048, 32), dtype=np.int8)  # rows x 64 KiB of Q8
    return QWeight(FMT_Q8, qs, rng.random((rows, 2048)).astype(np.float16), None)


def test_the_arena_ends_on_huge_pages():
    """Where the kernel has MADV_COLLAPSE the arena is written on 4 KiB pages (no huge-page
    advice, so no compaction at the first touch) and ``settle`` moves it onto 2 MiB pages
    after: every chunk the kernel reports collapsed is in huge pages, the bytes unchanged.
    Elsewhere the range is THP-eligible from the start wherever the kernel has THP on
    ("always" or "madvise"); a plain private map of the same size is not where THP waits
    for madvise."""
    from radixlm.native.arena import Arena

    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1][0]
    w = _q8_weight(512)  # 32 MiB, copied in
    arena = Arena([w], lib=None)
    _, arrays = arena.place(w)
    address = arena._buf.ctypes.data
    if pages.can_collapse():
        assert _smaps(address, "AnonHugePages") == ["0", "kB"]
        assert "hg" not in _smaps(address, "VmFlags")  # (no MADV_HUGEPAGE)
        before = [a.copy() for a in arrays]
        for _ in range(2):  # (once more where the kernel could not just then)
            thread = arena.settle()
            thread.join()
            if arena.collapsed_bytes:
                break
        if arena.collapsed_bytes == 0:  # the kernel has no huge page to give (a busy or
            # fragmented host), never a range it refuses (EINVAL: asked wrongly)
            assert _collapse_errno(address, arena._span) in (errno.EAGAIN, errno.ENOMEM)
        assert 0 <= arena.collapsed_bytes <= arena._span
        assert int(_smaps(address, "AnonHugePages")[0]) * 1024 >= arena.collapsed_bytes
        assert all(np.array_equal(a, b) for a, b in zip(arrays, before, strict=True))
    else:
        assert arena.settle() is None
        assert _thp_eligible(address) == (mode in "am")  # always / madvise
    plain = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)
    plain[0] = 1
    assert _thp_eligible(np.frombuffer(plain, np.uint8).ctypes.data) == (mode == "a")


def _collapse_errno(address: int, size: int) -> int:
    """MADV_COLLAPSE over the range once more: 0, or the kernel's errno (EAGAIN, ENOMEM: it
    could not, which ``pages.collapse`` leaves on 4 KiB pages; anything else: the range
    asked wrongly)."""
    import ctypes

    libc = pages._libc()
    return 0 if libc.madvise(address, size, pages.MADV_COLLAPSE) == 0 else ctypes.get_errno()


def test_collapse_stops_when_asked_and_keeps_the_bytes():
    """``pages.collapse`` over a populated map: nothing once ``stop`` is set, and the bytes
    of whatever it moved stay as they were."""
    import threading

    size = 8 << 20
    m = mmap.mmap(-1, size + (2 << 20), flags=mmap.MAP_PRIVATE)
    raw = np.frombuffer(m, dtype=np.uint8)
    buf = raw[(-raw.ctypes.data) % (2 << 20):][:size]
    buf[:] = np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8)
    want = buf.copy()
    stop = threading.Event()
    stop.set()
    assert pages.collapse(buf.ctypes.data, size, stop) == 0
    done = pages.collapse(buf.ctypes.data, size)
    assert done % pages.COLLAPSE_CHUNK == 0 or done == size
    assert done == 0 or pages.can_collapse()
    assert np.array_equal(buf, want)
    del buf, raw
    m.close()


def test_the_arena_moves_its_pages_at_the_lowest_priority(monkeypatch):
    """``settle``'s thread runs at nice 19 (the engine's first steps go first) and is given
    the arena's whole 2 MiB-rounded span."""
    import os
    import threading

    from radixlm.native.arena import Arena

    seen = []

    def record(address, size, stop=None):
        seen.append((os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), address, size))
        return size

    monkeypatch.setattr(pages, "can_collapse", lambda: True)
    monkeypatch.setattr(pages, "collapse", record)
    w = _q8_weight(40)  # 2.5 MiB: a span of two huge pages
    arena = Arena([w], lib=None)
    arena.place(w)
    arena.settle().join()
    assert seen == [(19, arena._buf.ctypes.data, 4 << 20)]
    assert arena.collapsed_bytes == 4 << 20


def test_the_move_stops_once_the_arena_is_let_go(monkeypatch):
    """``settle``'s thread holds no reference to the arena: letting the arena go sets the
    move's ``stop`` (and frees the memory), whatever is left of the move."""
    import gc
    import threading

    from radixlm.native.arena import Arena

    started, stopped = threading.Event(), []

    def slow(address, size, stop=None):
        started.set()
        stopped.append(stop.wait(timeout=10))
        return 0

    monkeypatch.setattr(pages, "can_collapse", lambda: True)
    monkeypatch.setattr(pages, "collapse", slow)
    w = _q8_weight(40)
    arena = Arena([w], lib=None)
    arena.place(w)
    thread = arena.settle()
    assert started.wait(timeout=10)
    del arena
    gc.collect()
    thread.join(timeout=10)
    assert stopped == [True]
