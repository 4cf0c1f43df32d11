"""Content addresses of K/V blocks on disk. Pure Python (hashlib).

A block is ``block_tokens`` consecutive tokens of a sequence, starting at a multiple of
``block_tokens``. Its key chains the keys before it: ``key_0 = sha256(fingerprint +
tokens of block 0)``, ``key_i = sha256(key_{i-1} + tokens of block i)``, tokens as
little-endian int32. So a key names the whole prefix up to the end of its block, and the
fingerprint (the model, its weights, the KV layout and the numerics settings) is part of
every key: another model, dtype or layout asks for other keys and never finds these.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

# Bytes of a weight file hashed for the fingerprint (its head and its tail): enough to tell
# two checkpoints apart, and cheap for a file of many GB.
_SAMPLE_BYTES = 1 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def _file_sample(path: Path) -> bytes:
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}:{size}:".encode())
    with open(path, "rb") as f:
        digest.update(f.read(_SAMPLE_BYTES))
        if size > 2 * _SAMPLE_BYTES:
            f.seek(size - _SAMPLE_BYTES)
            digest.update(f.read(_SAMPLE_BYTES))
    return digest.digest()


def model_fingerprint(model_dir: str | Path, layout: str, settings: dict[str, Any]) -> bytes:
    """32 bytes naming what K/V depends on: the model directory's config and weight files
    (name, size, head and tail), the pool's storage ``layout``, and ``settings`` (the
    numerics options, e.g. weight quantization). Two engines share blocks only if all of
    these agree."""
    root = Path(model_dir)
    digest = hashlib.sha256(b"radixlm-kv-blocks-v1\0")
    digest.update(layout.encode() + b"\0")
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode() + b"\0")
    for name in ("config.json", "radixlm_source.json"):
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    for path in sorted(root.iterdir()) if root.is_dir() else [root]:
        if path.is_file() and path.suffix in _WEIGHT_SUFFIXES:
            digest.update(_file_sample(path))
    return digest.digest()


def tokens_bytes(tokens: list[int]) -> bytes:
    """``tokens`` as little-endian int32 (how blocks hash and store them)."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


def block_keys(fingerprint: bytes, tokens: list[int], block_tokens: int,
               count: int | None = None) -> list[bytes]:
    """Keys of the first ``count`` whole blocks of ``tokens`` (all whole blocks if None)."""
    whole = len(tokens) // block_tokens
    count = whole if count is None else min(count, whole)
    keys: list[bytes] = []
    prev = fingerprint
    for i in range(count):
        prev = hashlib.sha256(prev + tokens_bytes(tokens[i * block_tokens:(i + 1) * block_tokens])
                              ).digest()
        keys.append(prev)
    return keys
