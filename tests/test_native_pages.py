"""A file map's pages (radixlm/native/pages.py): populated in one call before the arena's
copy reads them, given back after it; fresh memory populated before it is written."""

from __future__ import annotations

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


def _thp_eligible(address: int) -> bool:
    """``THPeligible`` of the mapping ``address`` lies in (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "THPeligible:":
            return line.split()[1] == "1"
    raise AssertionError(f"no mapping holds {address:#x}")


def test_the_arena_asks_for_huge_pages():
    """The arena's range is THP-eligible wherever the kernel has THP on ("always" or
    "madvise"); a plain private map of the same size is not where THP waits for madvise."""
    from radixlm.native.ops import Arena
    from radixlm.native.qweights import FMT_Q8, QWeight

    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1][0]
    qs = np.zeros((512, 2048, 32), dtype=np.int8)  # 32 MiB of Q8 rows, copied in
    w = QWeight(FMT_Q8, qs, np.ones((512, 2048), np.float16), None)
    arena = Arena([w], lib=None)
    assert _thp_eligible(arena._buf.ctypes.data) == (mode in "am")  # always / madvise
    plain = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE)
    plain[0] = 1
    address = np.frombuffer(plain, np.uint8).ctypes.data
    assert _thp_eligible(address) == (mode == "a")
