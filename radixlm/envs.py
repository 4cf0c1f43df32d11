"""Every environment variable radixlm reads, declared once (all prefixed ``RADIXLM_``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _get(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def cache_dir() -> Path:
    """Where converted weights and compiled grammars live (``RADIXLM_CACHE_DIR``)."""
    explicit = _get("RADIXLM_CACHE_DIR")
    if explicit:
        return Path(explicit)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("radixlm"))


def log_level() -> str:
    """Default log level (``RADIXLM_LOG_LEVEL``)."""
    return (_get("RADIXLM_LOG_LEVEL", "info") or "info").lower()


def torch_master_addr() -> tuple[str | None, str | None]:
    """torch.distributed's own rendezvous variables ``MASTER_ADDR`` and ``MASTER_PORT``
    (not ours, so unprefixed): the multi-host tensor-parallel rendezvous when
    ``--dist-init-addr`` is not given."""
    return _get("MASTER_ADDR"), _get("MASTER_PORT")


def kernels_override() -> str | None:
    """Force the kernel family: ``ref`` or ``triton`` (``RADIXLM_KERNELS``)."""
    return _get("RADIXLM_KERNELS")


def native_enabled() -> bool:
    """Native CPU ops (``RADIXLM_NATIVE``, default on; ``0`` forces the reference torch
    path, as on a host without a C compiler)."""
    return (_get("RADIXLM_NATIVE", "1") or "1").lower() not in ("0", "off", "false", "no")


# RADIXLM_CPU_ISA values: the flags of /proc/cpuinfo a host of that kind has at most
CPU_ISA_LEVELS = {
    "avx2": {"avx", "avx2", "fma", "f16c", "sse4_1", "sse4_2", "ssse3"},
    "generic": set(),
}


def cpu_isa() -> str:
    """Treat the CPU as one with at most this ISA (``RADIXLM_CPU_ISA``: ``native``, the
    default, or ``avx2`` / ``generic``): the native library is built for it, bf16 is not
    native (dtype auto is fp32), and torch's own kernels are capped the same way (see
    ``cap_cpu_isa``). How a benchmark shows an AVX2-only host's paths on an AVX-512 one."""
    value = (_get("RADIXLM_CPU_ISA", "native") or "native").lower()
    if value not in ("native", *CPU_ISA_LEVELS):
        raise ValueError(f"RADIXLM_CPU_ISA must be native|{'|'.join(CPU_ISA_LEVELS)}, "
                         f"got {value!r}")
    return value


def cap_cpu_isa() -> None:
    """With ``RADIXLM_CPU_ISA`` set, cap torch's ATen dispatch, oneDNN and MKL at that ISA
    (their own variables, only where unset; they must be set before torch runs a kernel)."""
    isa = cpu_isa()
    if isa == "native":
        return
    caps = {"avx2": ("avx2", "AVX2", "AVX2"), "generic": ("default", "SSE41", "SSE4_2")}[isa]
    for name, value in zip(("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                            "MKL_ENABLE_INSTRUCTIONS"), caps):
        os.environ.setdefault(name, value)


def configure_openmp() -> None:
    """Bound OpenMP's spin-wait before torch loads its runtime (``RADIXLM_OMP_SPINCOUNT``,
    default 20000; set it empty to keep the library default).

    libgomp's default spins ~300k iterations at every barrier. When another process or
    thread wants the same cores (a server's event loop, a second engine, a test run), the
    spinning threads steal them and a decode step measured 1.2 s instead of 27 ms on the
    2-core development machine. A short spin then sleep keeps idle-machine speed.
    """
    spin = _get("RADIXLM_OMP_SPINCOUNT", "20000")
    if spin:
        os.environ.setdefault("GOMP_SPINCOUNT", spin)


def freeze_gc() -> bool:
    """Move every object alive now (torch, transformers, the model's Python objects: ~200k)
    out of the collector's reach once an engine is loaded (``RADIXLM_GC_FREEZE``, default
    on), as vLLM does: each full collection otherwise walked them all, 150-250 ms pauses in
    a decode step or a grammar compile. Returns whether it froze. No collection first: at
    that point one finds ~30 unreachable objects (a 1B GGUF's engine) and costs 0.1-0.2 s
    of the start; those few stay, frozen."""
    if _get("RADIXLM_GC_FREEZE", "1") == "0":
        return False
    import gc

    gc.freeze()
    return True


@contextlib.contextmanager
def gc_paused():
    """The cyclic collector off for a stretch of the start that makes many objects and
    little garbage (torch's import: ~300k objects, ~7k of them garbage; an engine's
    construction: none found), then, where the stretch ended without an exception,
    everything alive moved out of the collector's reach (``freeze_gc``, the same policy and
    switch) and the collector restored. With it on, its passes over the young objects took
    0.1-0.3 s of a 1B GGUF's start on 2 cores (ready 1.84-2.00 s against 2.03-3.07, four
    alternating pairs); a collection afterwards instead would walk them all (0.3-0.5 s)."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    except BaseException:
        if was:
            gc.enable()
        raise
    freeze_gc()
    if was:
        gc.enable()


# glibc mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def configure_malloc() -> bool:
    """Keep freed memory in the process for reuse (``RADIXLM_MALLOC_TUNING``, default on;
    ``0`` keeps glibc's defaults). Returns whether the settings were applied.

    A forward pass allocates and frees many temporaries of 0.1-10 MB. With glibc's defaults
    the big ones are fresh ``mmap``s (and the heap top is trimmed back to the OS), so every
    step pays page faults to touch them again: an RMSNorm over 1024x576 bf16 took 2.4 ms
    instead of 0.6 ms, and even one-token steps pay. Serving every allocation under 32 MB
    from the heap and trimming only past 1 GB free removes that; the cost is that the
    process holds on to what it freed (a server reuses it on the next step anyway) until it
    goes idle (``trim_malloc``).
    """
    if _get("RADIXLM_MALLOC_TUNING", "1") == "0":
        return False
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return False
    _malloc_trim["libc"] = libc if ok else None
    return ok


_malloc_trim: dict = {"libc": None, "last": 0.0}


def trim_malloc(min_interval_s: float = 5.0) -> bool:
    """Give the free memory of every malloc arena back to the OS (glibc ``malloc_trim(0)``),
    at most once per ``min_interval_s`` and only after ``configure_malloc`` tuned malloc;
    the scheduler calls it when the engine goes idle. Returns whether it trimmed.

    With trimming held off while busy, each arena otherwise keeps the high-water mark of
    the steps and requests it served: after the quick stress run that was 60-130 MB of an
    idle server's RSS, all of it free (malloc_trim gave it back)."""
    import time

    libc, now = _malloc_trim["libc"], time.monotonic()
    if libc is None or now - _malloc_trim["last"] < min_interval_s:
        return False
    _malloc_trim["last"] = now
    libc.malloc_trim(0)
    return True


def tp_timeout_s() -> float:
    """Seconds a tensor-parallel collective may wait for a peer before failing
    (``RADIXLM_TP_TIMEOUT_S``, default 300)."""
    return float(_get("RADIXLM_TP_TIMEOUT_S", "300") or 300)
