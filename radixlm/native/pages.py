"""Giving a file mapping's pages back once their bytes were copied elsewhere.

A GGUF's tensors are read from a read-only map of the file and copied once into the native
library's arena. Each page the copy touched stays in the process's resident set for as long
as the map lives, so without this a model counted twice in memory while it loaded. ``release``
drops the pages of an array that lies in a file map (``MADV_DONTNEED``: the data stays in the
file and the page cache; touching the array again faults it back in); other arrays are left
alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap

import numpy as np

MADV_DONTNEED = 4  # <sys/mman.h> on Linux


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


def release(a: np.ndarray | None) -> int:
    """Drop the whole pages inside ``a`` from this process's resident set if ``a`` lies in a
    file map; returns the bytes released (0 for anything else, or where madvise is not to be
    had). The array stays valid: its pages fault back in from the file if read."""
    libc = _libc()
    if a is None or libc is None or not a.flags.c_contiguous or not file_mapped(a):
        return 0
    page = mmap.PAGESIZE
    start, end = a.ctypes.data, a.ctypes.data + a.nbytes
    lo, hi = -(-start // page) * page, end // page * page
    if hi <= lo:
        return 0
    return hi - lo if libc.madvise(lo, hi - lo, MADV_DONTNEED) == 0 else 0
