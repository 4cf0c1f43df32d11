"""Compiled-grammar caches: an in-memory LRU and an on-disk store of outlines-core indexes.

outlines-core 0.2.14 ``Index`` pickles (``__reduce__`` -> ``Index.from_binary``), so a
compiled index survives restarts. The directory is ``grammars/`` under
``radixlm.envs.cache_dir()`` (``$RADIXLM_CACHE_DIR`` or the user cache dir); entries are
keyed by a hash of (regex, tokenizer hash, vocab width, EOS ids, format version) and written
atomically (temp file + rename).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Any

FORMAT_VERSION = "grammar-v1"  # bump when the translation or the stored layout changes


def cache_dir() -> Path:
    """``$RADIXLM_CACHE_DIR/grammars`` or the platform's user cache dir."""
    from radixlm import envs

    return envs.cache_dir() / "grammars"


def cache_key(*parts: Any) -> str:
    h = hashlib.sha256(FORMAT_VERSION.encode())
    for p in parts:
        h.update(b"\x00" + repr(p).encode())
    return h.hexdigest()


class LRUCache:
    """A thread-safe LRU map bounded by entry count and, optionally, by total weight
    (``weigh(value)``, e.g. bytes)."""

    def __init__(self, capacity: int, max_weight: float = float("inf"), weigh=None):
        self.capacity = capacity
        self.max_weight = max_weight
        self._weigh = weigh or (lambda value: 0)
        self._weight = 0
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            if key in self._data:
                self._weight -= self._weigh(self._data[key])
            self._data[key] = value
            self._weight += self._weigh(value)
            self._data.move_to_end(key)
            while len(self._data) > 1 and (len(self._data) > self.capacity
                                           or self._weight > self.max_weight):
                _, old = self._data.popitem(last=False)
                self._weight -= self._weigh(old)

    def __len__(self) -> int:
        return len(self._data)


class DiskCache:
    """Pickled objects under ``directory``; failures to read or write are not errors."""

    def __init__(self, directory: Path | None = None, max_entry_bytes: int = 256 << 20):
        self.directory = directory or cache_dir()
        self.max_entry_bytes = max_entry_bytes

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.pkl"

    def get(self, key: str) -> Any:
        try:
            with open(self._path(key), "rb") as f:
                return pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError):
            return None

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except OSError:
            return 0

    def put_bytes(self, key: str, data: bytes) -> bool:
        if len(data) > self.max_entry_bytes:
            return False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self._path(key).with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_bytes(data)
            tmp.replace(self._path(key))
            return True
        except OSError:
            return False
