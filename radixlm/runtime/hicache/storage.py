"""The disk tier: K/V blocks in files under one directory (``--hicache-storage-backend file``).

Layout: ``DIR/<fingerprint>/<key>.kv``, one file per block of ``block_tokens`` tokens,
named by its content address (``keys.block_keys``: the model + KV layout fingerprint and
every token up to the end of the block). A file holds a header (magic, fingerprint, key,
token count, payload length, CRC-32), the block's token ids and its K/V in the pool's
storage format. A load checks all of it against what was asked (size, magic, fingerprint,
key, tokens, checksum) and never serves a file that fails: it is removed and counted.

Writes are write-through and asynchronous: the scheduler thread copies a new block's K/V
out of the pool and queues it (bounded in bytes; a full queue skips the block); a writer
thread writes it to a temporary name of its own process, fsyncs it and renames it into
place, so a crash mid-write leaves at most a temporary file (removed at the next start
when its writer is gone), never a wrong ``.kv`` file. Several servers may share a
directory: each writes its own temporary files, a rename is atomic, and a file another
server removed is a miss. Size: at most ``max_bytes`` of blocks (least recently used
removed first). A full disk at run time stops the writes with one log line; serving goes
on. At start the index is rebuilt from the file names (recency from their mtimes).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
import threading
import time
import zlib
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

from radixlm.runtime.hicache.keys import tokens_bytes
from radixlm.runtime.kv_pool import KVPayload

logger = logging.getLogger(__name__)

MAGIC = b"RLMKV01\n"
# magic, fingerprint, key, token count, flags (0), payload bytes, CRC-32 of the rest
_HEADER = struct.Struct("<8s32s32sIIQI")
SUFFIX = ".kv"
TMP_PREFIX = ".tmp-"
# A directory with less free space than this at start is full.
MIN_FREE_BYTES = 64 << 20
QUEUE_BYTES = 64 << 20  # K/V waiting for the writer at most


class FileStorage:
    """Blocks of K/V in files (see the module docstring). Thread-safe: the scheduler thread
    calls ``contains`` / ``load`` / ``put`` / ``flush``, the writer thread writes.

    ``codec``: the KV pool (its ``layout`` and ``token_bytes``; payloads go to and from bytes
    with ``KVPayload.to_bytes`` / ``from_bytes``).
    Raises ``ValueError`` at construction when ``directory`` is missing, not a writable
    directory, or full."""

    def __init__(self, directory: str | os.PathLike, fingerprint: bytes, codec: Any,
                 max_bytes: int, block_tokens: int = 64) -> None:
        root = Path(directory)
        _check_directory(root)
        if max_bytes < 1:
            raise ValueError(f"hicache storage size must be positive, got {max_bytes} bytes")
        self.root, self.fingerprint, self.codec = root, fingerprint, codec
        self.block_tokens, self.max_bytes = block_tokens, max_bytes
        self.block_bytes = _HEADER.size + 4 * block_tokens + block_tokens * codec.token_bytes
        self.dir = root / fingerprint.hex()[:32]
        self.dir.mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file bytes, LRU first
        self._bytes = 0
        self._queue: deque[tuple[bytes, list[int], Any]] = deque()
        self._pending: set[bytes] = set()
        self._queued_bytes = 0
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self.writes_disabled: str | None = None  # why the disk tier stopped writing
        self.counters = dict.fromkeys(
            ("written_blocks", "written_bytes", "loaded_blocks", "loaded_bytes",
             "corrupt_files", "missing_files", "evicted_files", "skipped_writes",
             "write_errors"), 0)
        self._remove_stale_temporaries()
        self._rebuild_index()
        free = shutil.disk_usage(root).free
        if free < max_bytes - self._bytes:
            logger.warning("hicache storage %s: %.1f GB free for up to %.1f GB of blocks; the "
                           "disk tier stops writing when it fills", root, free / 1e9,
                           max_bytes / 1e9)
        self._writer = threading.Thread(target=self._write_loop, name="radixlm-hicache-writer",
                                        daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ index
    def _path(self, key: bytes) -> Path:
        return self.dir / (key.hex() + SUFFIX)

    def _rebuild_index(self) -> None:
        found = []
        for entry in os.scandir(self.dir):
            name = entry.name
            if not name.endswith(SUFFIX) or len(name) != 64 + len(SUFFIX):
                continue
            try:
                key, st = bytes.fromhex(name[:64]), entry.stat()
            except (ValueError, OSError):
                continue
            found.append((st.st_mtime_ns, key, st.st_size))
        for _, key, size in sorted(found):
            self._index[key] = size
            self._bytes += size
        self._evict_over_bound()
        if found:
            logger.info("hicache storage %s: %d blocks (%.1f MB) found", self.dir, len(found),
                        self._bytes / 1e6)

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of writers that are gone (a crash mid-write) are removed."""
        for entry in os.scandir(self.dir):
            if not entry.name.startswith(TMP_PREFIX):
                continue
            pid = entry.name[len(TMP_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
                continue
            try:
                os.unlink(entry.path)
            except OSError:
                pass

    def contains(self, key: bytes) -> bool:
        """Whether a block is stored (in the index, or a file another server wrote)."""
        with self._lock:
            if key in self._index:
                return True
        try:
            size = self._path(key).stat().st_size
        except OSError:
            return False
        with self._lock:
            if key not in self._index:
                self._index[key] = size
                self._bytes += size
        return True

    def known(self, key: bytes) -> bool:
        """In the index or queued (no file system call: for write-through decisions)."""
        with self._lock:
            return key in self._index or key in self._pending

    @property
    def num_blocks(self) -> int:
        return len(self._index)

    @property
    def stored_bytes(self) -> int:
        return self._bytes

    # ------------------------------------------------------------------ reads
    def load(self, key: bytes, tokens: list[int]) -> Any | None:
        """The block's K/V payload (``len(tokens)`` tokens), or None when it is not there or
        fails a check (then it is removed, never served)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = bytearray(size)
                got = f.readinto(buf)
        except FileNotFoundError:
            self._forget(key, missing=True)
            return None
        except OSError as e:
            logger.warning("hicache storage: cannot read %s: %s", path.name, e)
            return None
        payload, why = self._decode(buf, got, key, tokens)
        if payload is None:
            logger.warning("hicache storage: skipped %s: %s", path.name, why)
            self._forget(key, corrupt=True)
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
            self.counters["loaded_blocks"] += 1
            self.counters["loaded_bytes"] += size
        try:
            os.utime(path)  # recency survives a restart
        except OSError:
            pass
        return payload

    def _decode(self, buf: bytearray, got: int, key: bytes,
                tokens: list[int]) -> tuple[Any | None, str]:
        n = len(tokens)
        want = _HEADER.size + 4 * n + n * self.codec.token_bytes
        if got != len(buf) or len(buf) != want:
            return None, f"{len(buf)} bytes, {want} expected (truncated or another layout)"
        magic, fingerprint, file_key, count, _, payload_len, crc = _HEADER.unpack_from(buf)
        if magic != MAGIC:
            return None, "not a K/V block file"
        if fingerprint != self.fingerprint:
            return None, "written for another model or KV layout"
        if file_key != key or count != n or payload_len != n * self.codec.token_bytes:
            return None, "its header names another block"
        view = memoryview(buf)
        body = _HEADER.size
        if zlib.crc32(view[body:], zlib.crc32(view[:_HEADER.size - 4])) != crc:
            return None, "checksum mismatch"
        if view[body:body + 4 * n] != tokens_bytes(tokens):
            return None, "its tokens differ from the prefix asked for"
        return KVPayload.from_bytes(self.codec.layout, view[body + 4 * n:]), ""

    def _forget(self, key: bytes, missing: bool = False, corrupt: bool = False) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self._bytes -= size
            if missing:
                self.counters["missing_files"] += 1
            if corrupt:
                self.counters["corrupt_files"] += 1

    # ------------------------------------------------------------------ writes
    def put(self, key: bytes, tokens: list[int], payload: Any) -> bool:
        """Queue a block for writing (``payload``: its K/V, a copy out of the pool). False
        when it is known already, the queue is full or writing stopped."""
        nbytes = payload.nbytes
        with self._lock:
            if self.writes_disabled or self._closing:
                return False
            if key in self._index or key in self._pending:
                return False
            if self._queued_bytes + nbytes > QUEUE_BYTES:
                self.counters["skipped_writes"] += 1
                return False
            self._queue.append((key, list(tokens), payload))
            self._pending.add(key)
            self._queued_bytes += nbytes
            self._wake.notify()
        return True

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return
                key, tokens, payload = self._queue.popleft()
            try:
                self._write(key, tokens, payload)
            finally:
                with self._lock:
                    self._pending.discard(key)
                    self._queued_bytes -= payload.nbytes
                    self._wake.notify_all()

    def _write(self, key: bytes, tokens: list[int], payload: Any) -> None:
        data = payload.to_bytes()
        body = [tokens_bytes(tokens), data]
        head = _HEADER.pack(MAGIC, self.fingerprint, key, len(tokens), 0, len(data), 0)[:-4]
        crc = zlib.crc32(head)
        for part in body:
            crc = zlib.crc32(part, crc)
        tmp = self.dir / f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{key.hex()[:16]}"
        try:
            with open(tmp, "wb") as f:
                f.write(head + struct.pack("<I", crc))
                for part in body:
                    f.write(part)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(key))
        except OSError as e:
            _unlink_quietly(tmp)
            self._write_failed(e)
            return
        size = len(head) + 4 + sum(len(p) for p in body)
        with self._lock:
            old = self._index.pop(key, None)
            self._bytes += size - (old or 0)
            self._index[key] = size
            self.counters["written_blocks"] += 1
            self.counters["written_bytes"] += size
            self._evict_over_bound()

    def _write_failed(self, e: OSError) -> None:
        with self._lock:
            self.counters["write_errors"] += 1
            if e.errno in (errno.ENOSPC, errno.EDQUOT) and not self.writes_disabled:
                self.writes_disabled = f"{self.dir} is full ({e.strerror})"
                dropped = len(self._queue)
                for queued_key, _, payload in self._queue:
                    self._pending.discard(queued_key)
                    self._queued_bytes -= payload.nbytes
                self._queue.clear()
                logger.error("hicache storage: %s; the disk tier stops writing (%d queued "
                             "blocks dropped), serving goes on", self.writes_disabled, dropped)
            elif self.counters["write_errors"] == 1:
                logger.error("hicache storage: writing a block failed: %s", e)

    def _evict_over_bound(self) -> None:
        """Remove least recently used blocks beyond ``max_bytes`` (holding the lock)."""
        while self._bytes > self.max_bytes and self._index:
            key, size = self._index.popitem(last=False)
            self._bytes -= size
            self.counters["evicted_files"] += 1
            _unlink_quietly(self._path(key))

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until the write queue is empty (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    # ------------------------------------------------------------------ admin
    def flush(self) -> int:
        """Remove every block of this fingerprint (queued writes are dropped, one being
        written is waited for); returns how many files were removed."""
        with self._lock:
            for queued_key, _, payload in self._queue:
                self._pending.discard(queued_key)
                self._queued_bytes -= payload.nbytes
            self._queue.clear()
        self.wait_idle()
        with self._lock:
            self._index.clear()
            self._bytes = 0
        removed = 0
        for entry in os.scandir(self.dir):
            if entry.name.endswith(SUFFIX):
                removed += _unlink_quietly(Path(entry.path))
        return removed

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to ``timeout`` s), then stop the writer."""
        self.wait_idle(timeout)
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        self._writer.join(timeout=timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self.counters, "blocks": len(self._index), "bytes": self._bytes,
                    "capacity_bytes": self.max_bytes, "queued_bytes": self._queued_bytes,
                    "writing": self.writes_disabled is None}


def _check_directory(root: Path) -> None:
    """A clear error unless ``root`` is an existing, writable directory with room."""
    if not root.exists():
        raise ValueError(f"hicache storage dir {str(root)!r} does not exist (create it, or "
                         "name another with --hicache-storage-dir)")
    if not root.is_dir():
        raise ValueError(f"hicache storage dir {str(root)!r} is not a directory")
    probe = root / f"{TMP_PREFIX}{os.getpid()}-probe"
    try:
        with open(probe, "wb") as f:
            f.write(b"x")
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"hicache storage dir {str(root)!r} is not writable: "
                         f"{e.strerror}") from e
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        raise ValueError(f"hicache storage dir {str(root)!r} is full: {free / 1e6:.1f} MB free, "
                         f"at least {MIN_FREE_BYTES / 1e6:.0f} MB needed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink_quietly(path: Path) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0
