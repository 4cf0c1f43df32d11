"""Hierarchical cache (SGLang's HiCache on a CPU): tiers below the KV pool.

- ``host.py``: the host tier's store, a pool of the KV pool's format outside its capacity;
- ``storage.py``: the disk tier, K/V blocks in content-addressed files;
- ``keys.py``: the content addresses (model + KV layout fingerprint, token prefix);
- ``tiers.py``: ``CacheTiers``, what the KV manager calls, and ``create_tiers``.

The radix tree itself knows the device and host tiers (``radix.HiRadixCache``); the disk
tier is found past the tree's match by content address, so it survives a restart.
"""

from radixlm.runtime.hicache.host import HostTier
from radixlm.runtime.hicache.storage import FileStorage
from radixlm.runtime.hicache.tiers import STORAGE_BLOCK_TOKENS, TIERS, CacheTiers, create_tiers

__all__ = ["STORAGE_BLOCK_TOKENS", "TIERS", "CacheTiers", "FileStorage", "HostTier",
           "create_tiers"]
