"""The cache tiers below the KV pool, as the KV manager sees them.

``CacheTiers`` owns the host tier's store (``HostTier``: the tiered radix tree's
``HostStore``) and, optionally, the disk tier (``FileStorage``). The tree decides what moves
between the device and the host; this object moves the bytes, finds a prefix's blocks on
disk past the tree's match (``storage_run``), loads them into pool slots
(``load_storage``), writes new whole blocks through to disk (``write_through``), and keeps
the per-tier counters ``/metrics`` shows.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from radixlm.runtime.hicache.host import HostTier
from radixlm.runtime.hicache.keys import block_keys, model_fingerprint
from radixlm.runtime.hicache.storage import FileStorage
from radixlm.runtime.kv_pool import KVPayload, KVPool, contiguous_run

logger = logging.getLogger(__name__)

TIERS = ("device", "host", "storage")
# Tokens per disk block (and the granularity of what survives a restart).
STORAGE_BLOCK_TOKENS = 64


class CacheTiers:
    """The host tier and the optional disk tier of one engine (see the module docstring).

    ``hit_tokens[tier]``: prompt tokens admissions took from each tier (monotonic)."""

    def __init__(self, pool: KVPool, host_tokens: int, storage: FileStorage | None) -> None:
        self.pool = pool
        self.host = HostTier(pool, host_tokens)
        self.storage = storage
        self.hit_tokens = dict.fromkeys(TIERS, 0)
        self.storage_written_tokens = 0

    # ------------------------------------------------------------------ the disk tier
    @property
    def block_tokens(self) -> int:
        return self.storage.block_tokens if self.storage is not None else 0

    def storage_run(self, tokens: list[int], start: int, stop: int) -> tuple[int, list[bytes]]:
        """The blocks on disk that extend a cached prefix of ``start`` tokens towards
        ``stop``: ``(first block index, their keys)``, consecutive from the block holding
        token ``start``, up to the one holding token ``stop - 1``; a block is keyed by its
        whole tokens, so ``tokens`` (the sequence) may run past ``stop``. ``(0, [])`` when
        there are none."""
        storage = self.storage
        if storage is None or stop <= start:
            return 0, []
        block = storage.block_tokens
        first, last = start // block, (stop - 1) // block
        keys = block_keys(storage.fingerprint, tokens, block, last + 1)
        run: list[bytes] = []
        for key in keys[first:]:
            if not storage.contains(key):
                break
            run.append(key)
        return first, run

    def load_storage(self, tokens: list[int], first: int, keys: list[bytes], start: int,
                     stop: int, slots: list[int]) -> int:
        """Write the K/V of tokens ``start:stop`` from the blocks ``keys`` (from block
        ``first``) into pool ``slots``, as far as the blocks load: a block that fails ends
        it. Returns how many tokens were written (``slots[:returned]`` hold them)."""
        storage, block = self.storage, self.block_tokens
        assert storage is not None
        parts = []
        for i, key in enumerate(keys, start=first):
            lo, hi = i * block, (i + 1) * block
            payload = storage.load(key, tokens[lo:hi])
            if payload is None:
                break
            parts.append(payload.slice(max(start - lo, 0), min(stop, hi) - lo))
        done = sum(p.num_tokens for p in parts)
        if contiguous_run(slots[:done]) is not None:  # block by block, plain copies
            pos = 0
            for part in parts:
                self.pool.write_slots(slots[pos:pos + part.num_tokens], part)
                pos += part.num_tokens
        elif done:
            self.pool.write_slots(slots[:done], KVPayload.concat(parts))
        return done

    def write_through(self, tokens: list[int], slots: list[int]) -> None:
        """Queue the whole blocks of ``tokens`` (K/V in pool ``slots``) not yet on disk: one
        copy out of the pool for all of them, then block by block to the writer."""
        storage = self.storage
        if storage is None or storage.writes_disabled:
            return
        block = storage.block_tokens
        new = [(i, key) for i, key in enumerate(block_keys(storage.fingerprint, tokens, block))
               if not storage.known(key)]
        if not new:
            return
        payload = self.pool.read_slots([s for i, _ in new for s in slots[i * block:
                                                                        (i + 1) * block]])
        for n, (i, key) in enumerate(new):
            part = payload.slice(n * block, (n + 1) * block)
            if storage.put(key, tokens[i * block:(i + 1) * block], part):
                self.storage_written_tokens += block

    # ------------------------------------------------------------------ admin
    def flush_storage(self) -> int:
        return self.storage.flush() if self.storage is not None else 0

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()

    def stats(self, cache: Any) -> dict[str, Any]:
        """Per-tier figures: ``tokens`` / ``bytes`` held, ``capacity_bytes``, ``hit_tokens``,
        ``promoted_tokens`` (to the device) and ``demoted_tokens`` (into the tier), and the
        disk tier's file counters."""
        token_bytes = self.pool.token_bytes
        host = self.host
        out: dict[str, Any] = {
            "device": {"tokens": cache.total_size, "bytes": cache.total_size * token_bytes,
                       "capacity_bytes": (self.pool.capacity - 1) * token_bytes,
                       "hit_tokens": self.hit_tokens["device"]},
            "host": {"tokens": cache.host_size, "bytes": cache.host_size * token_bytes,
                     "capacity_bytes": host.capacity_bytes,
                     "hit_tokens": self.hit_tokens["host"],
                     "promoted_tokens": cache.promoted_tokens,
                     "demoted_tokens": cache.demoted_tokens,
                     "evicted_tokens": cache.host_evicted_tokens + cache.dropped_tokens},
        }
        if self.storage is not None:
            s = self.storage.stats()
            out["storage"] = {"tokens": s["blocks"] * self.block_tokens, "bytes": s["bytes"],
                              "capacity_bytes": s["capacity_bytes"],
                              "hit_tokens": self.hit_tokens["storage"],
                              "promoted_tokens": self.hit_tokens["storage"],
                              "demoted_tokens": self.storage_written_tokens,
                              **{k: v for k, v in s.items() if k not in ("bytes",
                                                                          "capacity_bytes")}}
        return out


def host_tier_tokens(config: Any, pool: KVPool) -> int:
    """SGLang's sizing: ``hicache_size`` GB when given, else ``hicache_ratio`` times the
    device pool; ValueError when the host lacks that much free memory."""
    token_bytes = pool.token_bytes
    if config.hicache_size > 0:
        tokens = int(config.hicache_size * 1e9 // token_bytes)
    else:
        tokens = int((pool.capacity - 1) * config.hicache_ratio)
    if tokens < 1:
        raise ValueError(f"the host tier would hold {tokens} tokens: raise --hicache-ratio or "
                         "--hicache-size")
    avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    if tokens * token_bytes > avail:
        raise ValueError(f"the host tier needs {tokens * token_bytes / 1e9:.2f} GB "
                         f"({tokens} tokens) but {avail / 1e9:.2f} GB of memory is free: lower "
                         "--hicache-ratio or --hicache-size")
    return tokens


def create_tiers(config: Any, pool: KVPool, model_dir: Any) -> CacheTiers | None:
    """The tiers ``config`` asks for (None without ``enable_hierarchical_cache``)."""
    if not config.enable_hierarchical_cache:
        return None
    host_tokens = host_tier_tokens(config, pool)
    storage = None
    if config.hicache_storage_backend is not None:
        # the compute dtype too: an int8 layout alone does not say what the rows were
        # computed in (a bf16 and an fp32 engine quantize slightly different K/V)
        settings = {"weight_quant": config.weight_quant,
                    "native_activations": config.activations,
                    "dtype": str(pool.dtype).removeprefix("torch.")}
        fingerprint = model_fingerprint(model_dir, pool.layout, settings)
        storage = FileStorage(config.hicache_storage_dir, fingerprint, pool,
                              int(config.hicache_storage_size * 1e9),
                              block_tokens=STORAGE_BLOCK_TOKENS)
    logger.info("hierarchical cache: host tier %d tokens (%.2f GB)%s", host_tokens,
                host_tokens * pool.token_bytes / 1e9,
                f", disk tier {storage.dir}" if storage is not None else "")
    return CacheTiers(pool, host_tokens, storage)
