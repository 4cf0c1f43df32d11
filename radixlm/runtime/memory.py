"""How much memory an engine may use, and whether a model fits in it: read before anything
is allocated (``ModelRunner``'s pool sizing). No torch here."""

from __future__ import annotations

import os


def available_memory() -> int:
    """Bytes of memory available to this process: ``MemAvailable`` (free + reclaimable
    page cache), bounded by a cgroup limit where one is set."""
    avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    for path, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),):
        try:
            limit = open(path).read().strip()
            if limit != "max":
                avail = min(avail, int(limit) - int(open(used).read()))
        except (OSError, ValueError):
            pass
    return avail


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def check_fits(weights: int, per_token: int, free: int, context_len: int,
               max_total_tokens: int | None) -> None:
    """A ValueError with the numbers unless ``weights`` bytes and the K/V (``per_token``
    bytes a token) of one ``context_len`` context, or of the asked pool
    (``max_total_tokens``), fit in ``free`` bytes."""
    tokens = max_total_tokens if max_total_tokens is not None else context_len
    need = weights + tokens * per_token
    if need > free:
        what = (f"a pool of {tokens} tokens" if max_total_tokens is not None
                else f"one {tokens}-token context")
        raise ValueError(
            f"the model does not fit in memory: {_gib(weights)} of weights + "
            f"{_gib(tokens * per_token)} of K/V for {what} = {_gib(need)} needed, "
            f"{_gib(free)} available (a smaller --context-length, "
            "--max-total-tokens or --kv-cache-dtype int8 needs less)")
