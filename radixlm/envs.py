"""Every environment variable radixlm reads, declared once (all prefixed ``RADIXLM_``)."""

from __future__ import annotations

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


def kernels_override() -> str | None:
    """Force the kernel family: ``ref`` or ``triton`` (``RADIXLM_KERNELS``)."""
    return _get("RADIXLM_KERNELS")


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
