"""The disk tier's files (runtime/hicache/storage.py) on a small real KV pool, no model:
what is written reads back exactly, a damaged or foreign file is never served, the size
bound holds, a full disk stops writing without stopping anything else, and neither two
writers on one directory nor a writer killed mid-burst leave a file that reads back wrong."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from radixlm.runtime.hicache import storage as storage_mod
from radixlm.runtime.hicache.host import HostTier
from radixlm.runtime.hicache.keys import block_keys, model_fingerprint
from radixlm.runtime.hicache.storage import FileStorage
from radixlm.runtime.kv_pool import KVPayload, KVPool

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 8
FP = bytes(range(32))


def small_pool(dtype=torch.float32, heads=2, dim=4, layers=3, kv: str = "auto") -> KVPool:
    return KVPool(4 * BLOCK + 1, layers, heads, dim, dtype, torch.device("cpu"), 1, 1,
                  kv_cache_dtype=kv)


def block_payload(pool: KVPool, tokens: list[int]):
    """K/V that depends on the tokens (as real K/V would): written into pool slots 1..n and
    read out through the seam."""
    slots = list(range(1, len(tokens) + 1))
    base = torch.tensor(tokens, dtype=torch.float32).view(-1, 1, 1)
    for layer, (k, v) in enumerate(zip(pool.k_buffer, pool.v_buffer)):
        k[slots] = (base * 0.5 + layer).expand(-1, *k.shape[1:]).to(k.dtype)
        v[slots] = (base * -0.25 - layer).expand(-1, *v.shape[1:]).to(v.dtype)
    for layer, (ks, vs) in enumerate(zip(pool.k_scale, pool.v_scale)):  # an int8 pool's
        ks[slots] = (base[:, :, 0] * 0.125 + layer).expand(-1, ks.shape[1]).to(ks.dtype)
        vs[slots] = (base[:, :, 0] * -0.5 - layer).expand(-1, vs.shape[1]).to(vs.dtype)
    return pool.read_slots(slots)


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.arrays(), b.arrays(), strict=True))


def seq(n_blocks: int, salt: int = 0) -> list[int]:
    return [(salt * 7919 + i * 31) % 5000 for i in range(n_blocks * BLOCK)]


def write_all(store: FileStorage, pool: KVPool, tokens: list[int]) -> list[bytes]:
    keys = block_keys(store.fingerprint, tokens, BLOCK)
    for i, key in enumerate(keys):
        part = tokens[i * BLOCK:(i + 1) * BLOCK]
        assert store.put(key, part, block_payload(pool, part))
    assert store.wait_idle()
    return keys


def fill_random(pool: KVPool) -> None:
    gen = torch.Generator().manual_seed(0)
    for buf in pool.k_buffer + pool.v_buffer + pool.k_scale + pool.v_scale:
        if buf.dtype == torch.int8:
            buf.copy_(torch.randint(-127, 128, buf.shape, generator=gen, dtype=torch.int8))
        else:
            buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))


@pytest.mark.parametrize(("dtype", "kv"), [(torch.float32, "auto"), (torch.bfloat16, "auto"),
                                           (torch.bfloat16, "int8")])
@pytest.mark.parametrize("slots", [[3, 4, 5, 6, 7], [9, 2, 30, 4, 17]])
def test_the_pool_seam_moves_kv_bit_exactly(dtype, kv, slots):
    """read_slots / write_slots (the tiers' seam), consecutive and scattered slots, through
    a twin (the host tier's store) and through bytes (the disk tier's form); an int8
    pool's payload carries its int8 rows and bf16 scales, its twin stores them as such."""
    pool = small_pool(dtype, kv=kv)
    fill_random(pool)
    original = pool.read_slots(slots)
    assert len(original.k_scale) == (3 if kv == "int8" else 0)
    twin = pool.twin(16)
    assert twin.layout == pool.layout and twin.token_bytes == pool.token_bytes
    twin.write_slots([1, 2, 3, 4, 5], original)
    back = twin.read_slots([1, 2, 3, 4, 5])
    data = back.to_bytes()
    assert len(data) == back.nbytes == len(slots) * pool.token_bytes
    decoded = KVPayload.from_bytes(pool.layout, data)
    target = [20, 21, 25, 22, 31]
    pool.write_slots(target, decoded)
    assert same(pool.read_slots(target), original)
    joined = KVPayload.concat([original.slice(0, 2), original.slice(2, 5)])
    assert same(joined, original) and joined.nbytes == len(slots) * pool.token_bytes
    other = small_pool(torch.float16 if dtype == torch.bfloat16 else torch.bfloat16)
    if kv == "int8":  # the same model dtype, not quantized: another layout
        other = small_pool(dtype)
    with pytest.raises(ValueError, match="layout"):
        other.write_slots(target, original)
    with pytest.raises(ValueError, match="holds 5 tokens for 2 slots"):
        pool.write_slots([1, 2], original)
    with pytest.raises(ValueError, match="not whole tokens"):
        KVPayload.from_bytes(pool.layout, data[:-1])


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_blocks_read_back_exactly_and_the_index_survives_a_restart(tmp_path, kv):
    pool = small_pool(torch.bfloat16, kv=kv)
    store = FileStorage(tmp_path, FP, pool, max_bytes=1 << 30, block_tokens=BLOCK)
    tokens = seq(5)
    keys = write_all(store, pool, tokens)
    store.close()
    again = FileStorage(tmp_path, FP, pool, max_bytes=1 << 30, block_tokens=BLOCK)
    assert again.num_blocks == 5
    assert store.block_bytes == (storage_mod._HEADER.size + 4 * BLOCK
                                 + BLOCK * pool.token_bytes)
    assert again.stored_bytes == sum(p.stat().st_size for p in again.dir.glob("*.kv"))
    for i, key in enumerate(keys):
        part = tokens[i * BLOCK:(i + 1) * BLOCK]
        got = again.load(key, part)
        assert got is not None and same(got, block_payload(pool, part))
    assert again.stats()["corrupt_files"] == 0
    again.close()


def test_the_host_tier_keeps_an_int8_pools_rows_quantized():
    """Demote and load through the host tier of an int8 pool: the host store holds int8
    rows and bf16 scales at the int8 bytes per token, and what comes back is bit-exact (so
    attention reads the same dequantized K/V as before the round trip)."""
    pool = small_pool(torch.bfloat16, dim=16, kv="int8")
    gen = torch.Generator().manual_seed(1)
    slots = [5, 6, 7, 12, 3]
    loc = torch.tensor(slots)
    for layer in range(3):
        k, v = (torch.randn(5, 2, 16, generator=gen, dtype=torch.bfloat16) for _ in "kv")
        pool.store(layer, loc, k, v)
    host = HostTier(pool, 16)
    assert host.store.storage_dtype == torch.int8 and len(host.store.k_scale) == 3
    assert host.capacity_bytes == 16 * 2 * 3 * 2 * (16 + 2)  # int8 values + a bf16 scale
    before = pool.read_slots(slots)
    dequantized = [pool.rows(layer, loc) for layer in range(3)]
    held = host.demote(slots)
    assert same(host.store.read_slots(held), before)
    target = [20, 21, 22, 23, 24]
    host.load(held, target)
    assert same(pool.read_slots(target), before)
    for layer in range(3):
        k, v = pool.rows(layer, torch.tensor(target))
        assert torch.equal(k, dequantized[layer][0]) and torch.equal(v, dequantized[layer][1])
    assert host.demoted_tokens == host.loaded_tokens == 5


def test_the_fingerprint_tells_models_layouts_and_settings_apart(tmp_path):
    """Another checkpoint (same file size, other bytes), another config, another KV layout
    (int8 vs bf16 storage) or other numerics settings: another fingerprint, so other keys;
    an identical copy of the model shares them."""
    def model(name: str, weights: bytes, config: str = '{"layers": 3}') -> Path:
        root = tmp_path / name
        root.mkdir()
        (root / "config.json").write_text(config)
        (root / "model.safetensors").write_bytes(weights)
        return root

    layout, settings = "bfloat16/L3/H2/D4", {"weight_quant": "none", "dtype": "bfloat16"}
    base = model_fingerprint(model("a", b"\1" * 4096), layout, settings)
    assert model_fingerprint(model("copy", b"\1" * 4096), layout, settings) == base
    others = [model_fingerprint(model("w", b"\2" * 4096), layout, settings),
              model_fingerprint(model("c", b"\1" * 4096, '{"layers": 4}'), layout, settings),
              model_fingerprint(tmp_path / "a", "int8/L3/H2/D4", settings),
              model_fingerprint(tmp_path / "a", layout, {**settings, "dtype": "float32"}),
              model_fingerprint(tmp_path / "a", layout, {**settings, "weight_quant": "q8"})]
    assert len({base, *others}) == 6


def test_keys_name_the_whole_prefix_and_the_fingerprint():
    a = block_keys(FP, seq(3), BLOCK)
    b = block_keys(FP, seq(1) + seq(2, salt=9), BLOCK)
    assert a[0] == b[0] and a[1] != b[1]  # same first block, different history after it
    assert block_keys(bytes(32), seq(3), BLOCK)[0] != a[0]  # another model or layout
    assert len(block_keys(FP, seq(3)[:-1], BLOCK)) == 2  # only whole blocks


@pytest.mark.parametrize("damage", ["flip_payload", "flip_tokens", "truncate", "empty",
                                    "wrong_key_name", "foreign_fingerprint"])
def test_a_damaged_or_foreign_file_is_skipped_and_removed(tmp_path, damage):
    pool = small_pool()
    store = FileStorage(tmp_path, FP, pool, max_bytes=1 << 30, block_tokens=BLOCK)
    tokens = seq(2)
    keys = write_all(store, pool, tokens)
    path = store.dir / (keys[0].hex() + ".kv")
    data = bytearray(path.read_bytes())
    if damage == "flip_payload":
        data[-3] ^= 0x40
    elif damage == "flip_tokens":
        data[storage_mod._HEADER.size + 1] ^= 1
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "empty":
        data = bytearray()
    elif damage == "wrong_key_name":  # a valid file of block 1 under block 0's name
        data = bytearray((store.dir / (keys[1].hex() + ".kv")).read_bytes())
    elif damage == "foreign_fingerprint":  # another model's block, same tokens and name
        (tmp_path / "other").mkdir()
        other = FileStorage(tmp_path / "other", bytes(32), pool, 1 << 30, BLOCK)
        key0 = block_keys(bytes(32), tokens, BLOCK)[0]
        other.put(key0, tokens[:BLOCK], block_payload(pool, tokens[:BLOCK]))
        other.close()
        data = bytearray((other.dir / (key0.hex() + ".kv")).read_bytes())
    path.write_bytes(bytes(data))
    assert store.load(keys[0], tokens[:BLOCK]) is None
    assert not path.exists() and store.stats()["corrupt_files"] == 1
    assert not store.contains(keys[0])
    good = store.load(keys[1], tokens[BLOCK:])  # its neighbour is untouched
    assert good is not None and same(good, block_payload(pool, tokens[BLOCK:]))
    store.close()


def test_another_layout_never_reads_the_files(tmp_path):
    """Same fingerprint by mistake, another dtype: the payload length check refuses."""
    fp32, bf16 = small_pool(torch.float32), small_pool(torch.bfloat16)
    store = FileStorage(tmp_path, FP, fp32, max_bytes=1 << 30, block_tokens=BLOCK)
    tokens = seq(1)
    (key,) = write_all(store, fp32, tokens)
    store.close()
    reader = FileStorage(tmp_path, FP, bf16, max_bytes=1 << 30, block_tokens=BLOCK)
    assert reader.load(key, tokens) is None and reader.stats()["corrupt_files"] == 1
    reader.close()


def test_the_size_bound_removes_the_least_recently_used_blocks(tmp_path):
    pool = small_pool()
    probe = FileStorage(tmp_path, FP, pool, max_bytes=1 << 30, block_tokens=BLOCK)
    size = probe.block_bytes
    probe.close()
    store = FileStorage(tmp_path, FP, pool, max_bytes=3 * size, block_tokens=BLOCK)
    tokens = seq(5)
    keys = block_keys(FP, tokens, BLOCK)
    for i, key in enumerate(keys[:3]):
        store.put(key, tokens[i * BLOCK:(i + 1) * BLOCK],
                  block_payload(pool, tokens[i * BLOCK:(i + 1) * BLOCK]))
    store.wait_idle()
    assert store.load(keys[0], tokens[:BLOCK]) is not None  # block 0 is now the most recent
    for i in (3, 4):
        store.put(keys[i], tokens[i * BLOCK:(i + 1) * BLOCK],
                  block_payload(pool, tokens[i * BLOCK:(i + 1) * BLOCK]))
    store.wait_idle()
    present = {p.name[:64] for p in store.dir.glob("*.kv")}
    assert present == {keys[0].hex(), keys[3].hex(), keys[4].hex()}
    assert store.stored_bytes == 3 * size <= store.max_bytes
    assert store.stats()["evicted_files"] == 2
    store.close()


def test_startup_errors_name_the_problem(tmp_path, monkeypatch):
    pool = small_pool()
    with pytest.raises(ValueError, match="does not exist"):
        FileStorage(tmp_path / "missing", FP, pool, 1 << 30)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        FileStorage(tmp_path / "file", FP, pool, 1 << 30)
    with pytest.raises(ValueError, match="not writable"):
        FileStorage("/proc", FP, pool, 1 << 30)
    monkeypatch.setattr(storage_mod.shutil, "disk_usage",
                        lambda p: type("U", (), {"free": 1 << 20})())
    with pytest.raises(ValueError, match="is full"):
        FileStorage(tmp_path, FP, pool, 1 << 30)


def test_a_full_disk_stops_writing_once_and_reads_go_on(tmp_path, monkeypatch, caplog):
    pool = small_pool()
    store = FileStorage(tmp_path, FP, pool, max_bytes=1 << 30, block_tokens=BLOCK)
    tokens = seq(4)
    keys = write_all(store, pool, tokens[:2 * BLOCK])

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage_mod.os, "fsync", no_space)
    with caplog.at_level("ERROR", logger=storage_mod.__name__):
        more = block_keys(FP, tokens, BLOCK)[2:]
        for i, key in enumerate(more, start=2):
            store.put(key, tokens[i * BLOCK:(i + 1) * BLOCK],
                      block_payload(pool, tokens[i * BLOCK:(i + 1) * BLOCK]))
        store.wait_idle()
    full = [r for r in caplog.records if "stops writing" in r.getMessage()]
    assert len(full) == 1
    assert store.writes_disabled and not store.stats()["writing"]
    assert not store.put(b"\0" * 32, tokens[:BLOCK], block_payload(pool, tokens[:BLOCK]))
    assert not list(store.dir.glob(".tmp-*"))  # the failed write left nothing behind
    assert store.load(keys[1], tokens[BLOCK:2 * BLOCK]) is not None  # reads go on
    store.close()


WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_hicache_storage import BLOCK, FP, block_payload, small_pool, seq
    from radixlm.runtime.hicache.keys import block_keys
    from radixlm.runtime.hicache.storage import FileStorage
    pool = small_pool(heads={heads}, dim={dim})
    store = FileStorage({dir!r}, FP, pool, max_bytes=1 << 40, block_tokens=BLOCK)
    print("ready", flush=True)
    for salt in {salts}:
        tokens = seq({blocks}, salt)
        for i, key in enumerate(block_keys(FP, tokens, BLOCK)):
            part = tokens[i * BLOCK:(i + 1) * BLOCK]
            while not store.put(key, part, block_payload(pool, part)):
                if store.known(key):
                    break
                store.wait_idle(1)
    store.close(timeout=120)
    print("done", flush=True)
""")


def start_writer(directory: Path, salts: list[int], blocks: int, heads: int = 2,
                 dim: int = 4) -> subprocess.Popen:
    code = WRITER.format(tests=str(ROOT / "tests"), dir=str(directory), salts=salts,
                         blocks=blocks, heads=heads, dim=dim)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def check_every_file(directory: Path, heads: int = 2, dim: int = 4) -> int:
    """Every block file in ``directory`` reads back right (as some salt's block); returns
    how many there are."""
    pool = small_pool(heads=heads, dim=dim)
    store = FileStorage(directory, FP, pool, max_bytes=1 << 40, block_tokens=BLOCK)
    assert not list(store.dir.glob(".tmp-*")), "a temporary file of a dead writer was kept"
    expected = {}
    for salt in range(40):
        tokens = seq(6, salt)
        for i, key in enumerate(block_keys(FP, tokens, BLOCK)):
            expected[key] = tokens[i * BLOCK:(i + 1) * BLOCK]
    files = list(store.dir.glob("*.kv"))
    for path in files:
        key = bytes.fromhex(path.name[:64])
        assert key in expected, f"{path.name} is no block anybody wrote"
        got = store.load(key, expected[key])
        assert got is not None, f"{path.name} does not read back"
        assert same(got, block_payload(pool, expected[key]))
    assert store.stats()["corrupt_files"] == 0
    store.close()
    return len(files)


def test_two_writers_on_one_directory_do_not_corrupt_each_other(tmp_path):
    """Two processes write overlapping blocks (the same prefixes, and their own) at once."""
    a = start_writer(tmp_path, [0, 1, 2, 3, 4, 5], blocks=6)
    b = start_writer(tmp_path, [3, 4, 5, 6, 7, 8], blocks=6)
    assert a.wait(120) == 0 and b.wait(120) == 0
    assert check_every_file(tmp_path) == 9 * 6


def test_a_writer_killed_mid_burst_leaves_no_file_that_reads_back_wrong(tmp_path):
    """SIGKILL while a block is being written (a file of the directory is seen half
    written): what is there afterwards is either a complete block or gone (a temporary
    file, removed at the next start)."""
    heads, dim = 64, 1024  # 3 layers x 2 x 64 x 1024 x 4 B x 8 tokens: 12.6 MB a block
    block_bytes = 2 * 3 * heads * dim * 4 * BLOCK
    proc = start_writer(tmp_path, list(range(40)), blocks=6, heads=heads, dim=dim)
    fp_dir = tmp_path / FP.hex()[:32]
    deadline, partial = time.monotonic() + 120, None
    while time.monotonic() < deadline and partial is None:
        entries = list(os.scandir(fp_dir)) if fp_dir.exists() else []
        complete = sum(e.name.endswith(".kv") for e in entries)
        for e in entries:
            try:
                size = e.stat().st_size
            except FileNotFoundError:  # renamed meanwhile
                continue
            if complete >= 2 and size < block_bytes:
                partial = e.name
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert partial is not None, "never saw a block being written"
    left = len(list(fp_dir.glob("*.kv")))
    assert left >= 2
    assert check_every_file(tmp_path, heads=heads, dim=dim) == left
