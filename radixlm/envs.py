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
