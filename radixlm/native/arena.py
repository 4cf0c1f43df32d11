"""The arena: a model's block weights in one mapping, in step order (``Arena``), the C
views over them, and a decoder's matrices placed in it by its plan (``place_ahead``). No
torch here: a start places a GGUF's weights while torch is being imported
(``runtime/early.py``)."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from radixlm.native import pages
from radixlm.native.build import ACT_INT8, QMat, RepackMany
from radixlm.native.plan import StepWeights
from radixlm.native.qweights import (
    FMT_IQ4,
    FMT_Q3_K,
    FMT_Q4,
    FMT_Q4_K,
    FMT_Q5,
    FMT_Q5_K,
    FMT_Q6_K,
    FMT_Q8,
    KQUANTS,
    SUPER,
    QWeight,
)

REPACKED = (FMT_Q4_K, FMT_Q5_K, FMT_Q6_K)  # read 16 rows side by side by the int8 kernels
BLOCKS32 = (FMT_Q8, FMT_Q4, FMT_IQ4, FMT_Q5)  # likewise where every step is int8 (kx32.c)
IQ4_TYPES = ("IQ4_NL", "IQ4_XS")


class Arena:
    """All of a model's block weights in one anonymous mapping, in the order a step reads
    them, 2 MB aligned, on huge pages (``pages.huge``): a decode step streams every weight
    once, in order. ``qmat`` copies a QWeight in and returns its C view.

    K-quant rows that lie in a file map (a GGUF's own, contiguous) are used where they lie
    (``in_place``): the map is held, its pages populated once, nothing copied. A 1B decode
    step measured the same on the map's 4 KB pages as on the arena's (42.1-42.3 vs 42.6-45.5
    ms, 2-core Xeon), and the copy was most of a load (0.4 s a GiB).

    Where the library's int8 kernel reads K-quant rows 16 side by side
    (``lib.rlm_kx_rows()``, 512-bit builds), such a matrix's rows are repacked into the arena
    (``repacked``: Q4_K 2.8% and Q5_K 2.3% more bytes than the file's, Q6_K the same) and the file's
    pages given back (``pages.release``): the int8 steps read the repacked rows, the other
    paths (fp32 / bf16 activations, the embedding lookup) the file's, faulting in only what
    they touch. K-quant rows with no file behind them (rewritten at load: ``recode.py``)
    are kept repacked only where every step is int8 (the embedding lookup unpacks them).

    With ``int8_only`` (every step's activations int8 blocks) on a build whose kernel reads
    Q8 / Q4 rows 16 side by side (``lib.rlm_kx32_rows()``: 512-bit VNNI without AMX int8
    tiles), such a matrix of whole groups of 16 rows is copied in that layout only, at the
    size of the plain copy (kx32.c): a step then streams it with no per-step transposition.
    The embedding lookup unpacks its rows; no other path reads them.

    Likewise a Q3_K matrix of whole groups of 16 rows (``kx3``, ``lib.rlm_kx3_rows()``: AVX2
    and 512-bit builds without AMX int8 tiles) is placed in kx3.c's rows only: its rewrite's
    Q6_K numbers at 3 bits a weight, 114 bytes a row's super-block against the 210 of the
    Q6_K rows (the file's 110); the same bits as those rows on every int8 step. An IQ4_NL /
    IQ4_XS matrix of whole groups (``iq4``, kx32 builds, every step int8) is placed in
    kx32.c's IQ4 rows: the file's nibbles and its Q8 rewrite's scales, 18 bytes a row's
    block of 32 against the rewrite's 34, that rewrite's bits; a Q5_0 matrix (``q5``) in
    kx32.c's Q5 rows: the file's bytes repacked (22 a row's block against its Q8 rewrite's
    34), that rewrite's bits."""

    ALIGN, HUGE = 64, 2 << 20

    def __init__(self, weights: list[QWeight], lib=None, threads: int = 1,
                 int8_only: bool = False) -> None:
        self._held: list[np.ndarray] = []  # file-map arrays the C views point into
        self._lib, self._threads, self._in_place_bytes, self.repacked_bytes = lib, threads, 0, 0
        self._kx = lib is not None and bool(lib.rlm_kx_rows())
        self._every_int8 = int8_only
        self._kx32 = int8_only and lib is not None and bool(lib.rlm_kx32_rows())
        self._kx3 = int8_only and lib is not None and bool(lib.rlm_kx3_rows())
        self._int8_only = False  # (set once a matrix is placed repacked only)
        size = sum(self._plain_bytes(w) for w in weights
                   if not self.in_place(w) and not self.repacked(w))
        size += sum(self._padded(lib.rlm_kx_bytes(self._kx_fmt(w), w.n, w.k))
                    for w in weights if self.repacked(w))
        # a private map, on huge pages once settled (a decode step streams all of it; see
        # ``settle``); a shared map (shmem) fills at half the rate of a private one (10 GiB:
        # 11.7-12.8 s against 5.3 s, Zen 4 VM)
        self._map = mmap.mmap(-1, size + 2 * self.HUGE, flags=mmap.MAP_PRIVATE)
        raw = np.frombuffer(self._map, dtype=np.uint8)
        start = (-raw.ctypes.data) % self.HUGE
        self._buf, self._used = raw[start:start + size], 0
        self._span = -(-size // self.HUGE) * self.HUGE
        self.collapsed_bytes = 0
        self._collapse_after = pages.can_collapse()
        if not self._collapse_after:  # (huge pages at the first touch: the kernel compacts first)
            pages.huge(self._buf.ctypes.data, self._span)
        pages.populate(self._buf.ctypes.data, size, write=True,  # all of it is written next
                       threads=max(1, threads))

    def settle(self) -> threading.Thread | None:
        """Move the placed weights onto 2 MiB pages, on a thread of its own (returned; None
        where there is nothing to do). A decode step streams every weight once, and on 4 KiB
        pages pays a TLB miss every 4 KiB: a 1B Q4_K_M step 33.5-39.8 ms on 2 MiB pages
        against 37.7-45.8 ms on 4 KiB ones, an 8B's 231-247 against 262-283 (Ice Lake VM,
        alternating pairs). Asked for at the first touch (``pages.huge``), they cost the
        start the kernel's compaction: the 1B's arena 0.9-1.7 s against 0.14-0.29 s on
        4 KiB pages. So where the kernel has ``MADV_COLLAPSE`` the arena is written on 4 KiB
        pages and moved here after (``pages.collapse``: the same addresses and bytes), on
        a thread at the lowest priority (nice 19), so the engine's first steps go first: a
        first 48-token request right after a 1B start took 2.9-3.6 s with it as without it,
        3.4-4.0 s at the default priority; the 650 MiB were moved within 4 s. Elsewhere the
        arena was on huge pages from the start. The thread does not keep the arena: once it
        is let go the move stops at the next chunk (``pages.collapse``'s ``stop``)."""
        if not self._collapse_after or self._span == 0:
            return None
        stop = threading.Event()
        weakref.finalize(self, stop.set)  # (the arena let go: the move stops)
        thread = threading.Thread(target=_collapse, name="radixlm-pages", daemon=True,
                                  args=(weakref.ref(self), self._buf.ctypes.data, self._span,
                                        stop))
        thread.start()
        return thread

    @staticmethod
    def arrays(w: QWeight) -> list[np.ndarray]:
        """``w``'s arrays as the C side reads them (each laid out contiguously where it is
        copied; here they may be strided views, e.g. a GGUF block's quants between its
        scales): qs, fp16 d (and fp16 m for Q4); dense rows and K-quant rows alone."""
        if w.dense or w.d is None:  # dense rows, K-quant super-blocks: the rows alone
            return [w.qs]
        arrays = [w.qs, np.asarray(w.d, dtype=np.float16)]
        if w.fmt == FMT_Q4:
            arrays.append(np.asarray(w.m, dtype=np.float16))
        return arrays

    @property
    def int8_only(self) -> bool:
        """Whether some matrix here is readable by int8 steps only (Q8 / Q4 rows
        repacked, rewritten K-quant rows)."""
        return self._int8_only

    @property
    def held_bytes(self) -> int:
        """Bytes of weights read in place (not copied into the arena)."""
        return self._in_place_bytes

    def kx3(self, w: QWeight) -> bool:
        """Whether ``w`` (a pending Q3_K rewrite) is placed in kx3.c's rows (see the class)."""
        return self._kx3 and w.pending == "Q3_K" and w.n % 16 == 0

    def iq4(self, w: QWeight) -> bool:
        """Whether ``w`` (a pending IQ4_NL / IQ4_XS rewrite) is placed in kx32.c's IQ4 rows:
        its nibbles at about the file's size, the Q8 rewrite's bits on every step (else
        that rewrite's Q8 rows)."""
        return self._kx32 and w.pending in IQ4_TYPES and w.n % 16 == 0

    def q5(self, w: QWeight) -> bool:
        """Whether ``w`` (a pending Q5_0 rewrite) is placed in kx32.c's Q5 rows (else its
        rewrite's Q8 rows)."""
        return self._kx32 and w.pending == "Q5_0" and w.n % 16 == 0

    def kind(self, w: QWeight) -> str:
        """What ``w``'s numbers are once placed (``iq4_xs`` where ``iq4``, ``q5_0`` where
        ``q5``, else its kind)."""
        return w.pending.lower() if self.iq4(w) or self.q5(w) else w.kind

    def _kx_fmt(self, w: QWeight) -> int:
        """The format ``w``'s repacked rows hold (FMT_Q3_K for ``kx3``, FMT_IQ4 for ``iq4``,
        FMT_Q5 for ``q5``)."""
        return (FMT_Q3_K if self.kx3(w) else FMT_IQ4 if self.iq4(w)
                else FMT_Q5 if self.q5(w) else w.fmt)

    def repacked(self, w: QWeight) -> bool:
        """Whether ``w``'s rows are repacked for the int8 kernel (see the class)."""
        if w.fmt in BLOCKS32:
            return self._kx32 and w.n >= 16 and w.n % 16 == 0
        return self._kx and w.fmt in REPACKED and w.n >= 16 and w.qs.flags.c_contiguous

    @property
    def copied_bytes(self) -> int:
        """Bytes written into the arena (copies and repacked rows: ``repacked_bytes``)."""
        return self._used

    @staticmethod
    def in_place(w: QWeight) -> bool:
        """Whether ``w`` is read where it lies (K-quant rows in a file map) instead of copied:
        the kernels read those rows with unaligned loads only."""
        return (w.fmt in KQUANTS and not w.pending and w.qs.flags.c_contiguous
                and pages.file_mapped(w.qs))

    def _plain_bytes(self, w: QWeight) -> int:
        """Arena bytes of ``w``'s copy in its own layout (K-quant rows: from the format, so
        a ``pending`` rewrite's too)."""
        if w.fmt in KQUANTS:
            return self._padded(w.n * (w.k // SUPER) * KQUANTS[w.fmt][1])
        if w.pending:  # (IQ4 rows: Q8 blocks once rewritten, int8 values and fp16 scales)
            return self._padded(w.n * w.k) + self._padded(w.n * w.k // 32 * 2)
        return sum(self._padded(a.nbytes) for a in self.arrays(w))

    def _padded(self, n: int) -> int:
        return (n + self.ALIGN - 1) // self.ALIGN * self.ALIGN

    def qmat(self, w: QWeight) -> QMat:
        return self.place(w)[0]

    def place(self, w: QWeight) -> tuple[QMat, list[np.ndarray]]:
        """``w`` copied in: its C view, and its arrays' copies here (same dtypes and
        shapes as ``arrays(w)``; for an ``in_place`` weight, its own arrays). A ``pending``
        rewrite is done here (its rows live until copied or repacked; kx3 repacks the
        file's Q3_K rows themselves)."""
        fmt = self._kx_fmt(w)
        if fmt == FMT_IQ4:
            w = w.as_iq4(self._threads)
        elif fmt == FMT_Q5:
            w = w.as_q5()
        elif fmt != FMT_Q3_K:
            w = w.materialized(self._threads)
        if self.repacked(w):  # (a batch of one: place_all's repacking)
            view, job = self._repack_job(w, fmt)
            self._lib.rlm_repack_many(ctypes.byref(job), 1, max(1, self._threads))
            return view
        if self.in_place(w):
            pages.populate_read(w.qs)  # (the first step would fault each page in)
            self._held.append(w.qs)
            self._in_place_bytes += w.qs.nbytes
            return _qmat(w, [w.qs]), [w.qs]
        copies = []
        for a in self.arrays(w):
            pages.populate_read(a)  # a file map's pages in one call, not a fault each
            dst = self._buf[self._used:self._used + a.nbytes].view(a.dtype).reshape(a.shape)
            dst[...] = a  # (a strided view is gathered here: no copy of it in between)
            copies.append(dst)
            self._used += self._padded(a.nbytes)
        return _qmat(w, copies), copies

    def place_all(self, order: list[QWeight], threads: int,
                  release=None) -> dict[int, tuple[QMat, list[np.ndarray]]]:
        """Every matrix of ``order`` placed, in that order (``place``; by ``id``), with
        ``release(w)`` called once w is copied (not for one read in place). The file map's
        rows that are repacked in their own format (``batched``) are repacked in one C call
        at the end on ``threads`` threads, each one's file pages given back once done
        (``rlm_repack_many``): a start places a GGUF beside torch's import
        (``runtime/early.py``), which holds the GIL for long stretches, and a call per
        matrix waited for it each time (a 1B's 113 matrices: 0.7 s there, 0.2 s in one
        call). The same bytes where they would be one by one."""
        views, jobs = {}, []
        for w in order:
            if self.batched(w):
                views[id(w)], job = self._repack_job(w, w.fmt)
                jobs.append(job)
                continue
            views[id(w)] = self.place(w)
            if release is not None and not self.in_place(w):
                release(w)
        if jobs:
            self._lib.rlm_repack_many((RepackMany * len(jobs))(*jobs), len(jobs),
                                      max(1, threads))
        return views

    def batched(self, w: QWeight) -> bool:
        """Whether ``place_all`` repacks ``w`` in its one call: rows of a file map (not
        rewritten at load) that are repacked (see the class) in their own format."""
        return (not w.pending and (w.fmt in REPACKED or w.fmt in BLOCKS32)
                and self.repacked(w) and pages.file_mapped(w.qs))

    def _repack_job(self, w: QWeight,
                    fmt: int) -> tuple[tuple[QMat, list[np.ndarray]], RepackMany]:
        """``w``'s place in the arena for its rows repacked in ``fmt`` (``_kx_fmt``), its C
        view and the arrays behind it (``place``'s answer), and the ``rlm_repack_many`` job
        that repacks the rows there and then gives back their file pages, if in a file map.
        Read by int8 steps only (the view holds no plain rows): Q8 / Q4 rows (kx32), kx3's
        (the file's Q3_K rows, read by no path now) and rows made at load where every step
        is int8 (recode.py: not kept twice); others keep the plain rows beside."""
        nbytes = int(self._lib.rlm_kx_bytes(fmt, w.n, w.k))
        dst = self._buf[self._used:self._used + nbytes]
        self._used += self._padded(nbytes)
        self.repacked_bytes += nbytes
        mapped = pages.file_mapped(w.qs)
        lo, hi = pages.whole_pages(w.qs) if mapped else (0, 0)
        job = repack_job(w, dst, fmt)
        job.drop, job.drop_len = lo, max(0, hi - lo)
        made = self._every_int8 and w.n % 16 == 0 and not mapped
        if w.fmt in BLOCKS32 or fmt == FMT_Q3_K or made:
            self._int8_only = True
            return (_qmat(w, [], dst, fmt), []), job
        self._held.append(w.qs)  # (read again, if at all, only by the paths that need them)
        return (_qmat(w, [w.qs], dst, fmt), [w.qs]), job


def _collapse(arena: weakref.ref, address: int, span: int, stop: threading.Event) -> None:
    """``Arena.settle``'s thread: the arena's span onto huge pages at nice 19."""
    try:  # (Linux: a thread's own nice; the kernel's copying runs at it)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:
        pass
    done = pages.collapse(address, span, stop)
    held = arena()
    if held is not None:
        held.collapsed_bytes = done


def _kx32_rows(w: QWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``w``'s Q8 / Q4 / IQ4 / Q5 rows as ``rlm_repack_kx32`` reads them: quants [n, blocks,
    32 | 16] and fp16 scales (and Q4's minimums, Q5's fifth bits) [n, blocks], contiguous
    arrays or a GGUF's strided block views alike; a ValueError for any other layout."""
    qs = w.qs.reshape(w.n, -1, w.qs.shape[-1])
    d = np.asarray(w.d).reshape(w.n, -1)
    m = None if w.fmt not in (FMT_Q4, FMT_Q5) else np.asarray(w.m).reshape(w.n, -1)
    m_dtype = np.uint32 if w.fmt == FMT_Q5 else np.float16  # (Q5: its fifth bits)
    if qs.strides[2] != 1 or d.dtype != np.float16 or (m is not None and m.dtype != m_dtype):
        raise ValueError("rows to repack need byte quants and fp16 scales")
    return qs, d, m


def repack_job(w: QWeight, dst: np.ndarray, fmt: int) -> RepackMany:
    """The ``rlm_repack_many`` job (csrc/layer.c) that repacks ``w``'s rows into ``dst``
    (``rlm_kx_bytes`` bytes) in ``fmt``: K-quant rows (contiguous), or Q8 / Q4 quants and
    scales with their strides (``_kx32_rows``); no pages given back (``drop`` unset)."""
    if w.fmt not in BLOCKS32:
        if not w.qs.flags.c_contiguous:
            raise ValueError("K-quant rows to repack must be contiguous")
        return RepackMany(src=w.qs.ctypes.data, fmt=fmt, n=w.n, k=w.k, dst=dst.ctypes.data)
    qs, d, m = _kx32_rows(w)
    job = RepackMany(src=qs.ctypes.data, fmt=fmt, n=w.n, k=w.k, dst=dst.ctypes.data,
                     blocks32=1, qrow=qs.strides[0], qblk=qs.strides[1], d=d.ctypes.data,
                     drow=d.strides[0], dblk=d.strides[1])
    if m is not None:
        job.m, job.mrow, job.mblk = m.ctypes.data, m.strides[0], m.strides[1]
    return job


def repack(lib, w: QWeight, dst: np.ndarray, threads: int = 1) -> None:
    """``w``'s rows repacked into ``dst`` in their own format now (``repack_job``: the
    arena's repacking, outside an arena)."""
    lib.rlm_repack_many(ctypes.byref(repack_job(w, dst, w.fmt)), 1, max(1, threads))


def _qmat(w: QWeight, arrays: list[np.ndarray], repacked: np.ndarray | None = None,
          fmt: int | None = None) -> QMat:
    """``w``'s C view over ``arrays`` (and ``repacked`` rows, in ``fmt``: w's own unless
    given)."""
    ptrs = [a.ctypes.data for a in arrays] + [None, None, None]
    return QMat(w.fmt if fmt is None else fmt, w.n, w.k, ptrs[0], ptrs[1], ptrs[2],
                None if repacked is None else repacked.ctypes.data)


@dataclass
class Placed:
    """A decoder's matrices placed (``place_ahead``): the arena, each matrix's C view and
    arrays (``Arena.place``'s answer), looked up by the matrix (``view``), and the plan they
    were placed by (``weights``, ``modes``: ``native/plan.py``)."""

    arena: Arena
    views: dict[int, tuple[QMat, list[np.ndarray]]]
    weights: StepWeights
    modes: tuple[tuple[int, int], ...]

    def view(self, w: QWeight) -> tuple[QMat, list[np.ndarray]]:
        return self.views[id(w)]


def give_back(w: QWeight) -> None:
    """``w``'s file pages given back (``pages.release``): a ``place_ahead`` release for
    weights whose file map the arena replaces."""
    for rows in (w.qs, w.d, w.m):
        pages.release(rows)


def arena_for(lib, weights: StepWeights, modes: tuple[tuple[int, int], ...],
              threads: int) -> Arena:
    """The arena ``weights`` are placed in (int8 rows only where every mode is int8), its
    map populated on ``threads`` threads, nothing placed yet (``place_in``)."""
    return Arena(weights.order, lib, threads,
                 int8_only=all(mode == ACT_INT8 for _, mode in modes))


def place_in(arena: Arena, weights: StepWeights, modes: tuple[tuple[int, int], ...],
             threads: int, release=None) -> Placed:
    """Every matrix of ``weights`` placed in ``arena`` (``arena_for``) in step order
    (``Arena.place_all``) on ``threads`` threads. ``release(w)``: called once the arena
    holds w's copy (a file map gives its pages back; not for a weight read in place)."""
    return Placed(arena, arena.place_all(weights.order, threads, release), weights, modes)


def place_ahead(lib, weights: StepWeights, modes: tuple[tuple[int, int], ...], threads: int,
                release=None) -> Placed:
    """``arena_for`` and ``place_in`` at once."""
    return place_in(arena_for(lib, weights, modes, threads), weights, modes, threads, release)
