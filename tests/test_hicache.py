"""The hierarchical cache on the real model: a prefix evicted to the host tier comes back
with the K/V it had (the same tokens and logprobs as a device hit, and as recomputing it);
a disk tier serves a known prefix after a restart (two engines in sequence over one
directory; real servers sharing one, then restarted on it); a damaged block and another
dtype's blocks are never served; the KV accounting of every tier holds across moves,
promotions, aborts and speculative drafts.

Reference for "same as recompute": the first run of a prompt computes all of its K/V; a
hit from any tier brings back those K/V bits exactly (checked), so its outputs equal the
first run's up to the rounding of the last prompt token, which a hit recomputes in a step
of another size: on the fp32 torch path |delta logprob| <= 1e-4; on the default native
path (int8 blocks at every step size, batch-invariant: issue 30) the same bits, so the
native and restart tests compare logprobs with ==."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from server_fakes import STARTUP_POLL_S, free_port, health_ok, wait_until

from radixlm.runtime.engine import Engine
from radixlm.runtime.hicache import STORAGE_BLOCK_TOKENS
from radixlm.runtime.hicache.keys import block_keys

ROOT = Path(__file__).resolve().parent.parent
GREEDY = {"temperature": 0, "max_new_tokens": 12}
POOL = 512


def test_flags_reach_the_config_and_bad_settings_are_named(tmp_path, caplog):
    from radixlm.cli import build_parser, engine_kwargs_from_args
    from radixlm.runtime.config import EngineConfig

    def config(*flags):
        return EngineConfig.from_kwargs(**engine_kwargs_from_args(
            build_parser().parse_args(["serve", *flags])))

    got = config("--enable-hierarchical-cache", "--hicache-ratio", "3", "--hicache-size", "2.5",
                 "--hicache-storage-backend", "file", "--hicache-storage-dir", str(tmp_path),
                 "--hicache-storage-size", "1.5")
    assert (got.enable_hierarchical_cache, got.hicache_ratio, got.hicache_size) == (True, 3, 2.5)
    assert (got.hicache_storage_backend, got.hicache_storage_dir, got.hicache_storage_size) == (
        "file", str(tmp_path), 1.5)
    assert config().enable_hierarchical_cache is False and config().hicache_ratio == 2.0
    bad = {("--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake",
            "--hicache-storage-dir", str(tmp_path)): "supported: file",
           ("--enable-hierarchical-cache", "--hicache-storage-backend", "file"):
               "go together",
           ("--hicache-storage-backend", "file", "--hicache-storage-dir", str(tmp_path)):
               "needs enable_hierarchical_cache",
           ("--enable-hierarchical-cache", "--hicache-storage-backend", "file",
            "--hicache-storage-dir", str(tmp_path / "nope")): "does not exist",
           ("--enable-hierarchical-cache", "--hicache-ratio", "0"): "hicache_ratio must be",
           ("--enable-hierarchical-cache", "--disable-radix-cache"): "needs the radix cache",
           ("--enable-hierarchical-cache", "--tp-size", "2"): "tp_size > 1"}
    for flags, message in bad.items():
        with pytest.raises(ValueError, match=message):
            config(*flags)
    from radixlm.cli import ignored_flags

    args = build_parser().parse_args(["serve", "--hicache-write-policy", "write_through",
                                      "--hicache-mem-layout", "page_first"])
    assert sorted(ignored_flags(args)) == ["hicache_mem_layout", "hicache_write_policy"]
    with caplog.at_level("WARNING", logger="radixlm"):  # SGLang's GPU-side knobs: named
        EngineConfig.from_kwargs(enable_hierarchical_cache=True, hicache_io_backend="kernel",
                                 hicache_write_policy="write_through")
    assert "hicache_io_backend, hicache_write_policy" in caplog.text


def story(i: int, words: int = 75) -> str:
    return f"Log {i}: " + " ".join(f"entry{i}x{j}" for j in range(words))


def run(engine: Engine, prompt: str) -> dict:
    return engine.generate(prompt, GREEDY, return_logprob=True)


def logprobs(result: dict) -> list[float]:
    return [lp for lp, _, _ in result["meta_info"]["output_token_logprobs"]]


def max_delta(a: dict, b: dict) -> float:
    return max(abs(x - y) for x, y in zip(logprobs(a), logprobs(b), strict=True))


def check_accounting(engine: Engine) -> dict:
    """Every pool slot and every host slot in exactly one place; each tier's bytes are its
    tokens at the pool's bytes per token; the disk tier's bytes are its files' sizes."""
    engine.check_integrity()
    kv = engine.scheduler.kv
    stats = engine.get_stats()["hicache"]
    per_token = engine.runner.pool.token_bytes
    for tier in ("device", "host"):
        assert stats[tier]["bytes"] == stats[tier]["tokens"] * per_token
    assert stats["host"]["tokens"] == kv.cache.host_size
    storage = kv.tiers.storage
    if storage is not None:
        assert storage.wait_idle()
        on_disk = sum(p.stat().st_size for p in storage.dir.glob("*.kv"))
        assert engine.get_stats()["hicache"]["storage"]["bytes"] == on_disk
    return stats


@pytest.fixture(scope="module", params=["fp32-torch", "native"])
def host_engine(request):
    """A pool of 512 tokens with a host tier 8x as large: on the fp32 torch reference
    path (with its per-row K/V mirror), and on the default native CPU path."""
    kwargs = ({"dtype": "float32", "weight_quant": "none"} if request.param == "fp32-torch"
              else {})
    with Engine(max_total_tokens=POOL, enable_hierarchical_cache=True, hicache_ratio=8,
                log_level="warning", **kwargs) as engine:
        engine.kind = request.param
        yield engine


def prefix_kv(engine: Engine, ids: list[int]):
    """The K/V the cache holds for ``ids`` (device part), read on the scheduler thread."""
    s = engine.scheduler
    match = s.call(lambda: s.kv.cache.match_prefix(ids, count_hit=False))
    return s.call(lambda: engine.runner.pool.read_slots(match.slots))


def test_eviction_to_host_and_back_gives_the_same_kv_tokens_and_logprobs(host_engine):
    engine = host_engine
    assert engine.flush_cache()
    prompt = story(0)
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    first = run(engine, prompt)  # computes every token: the recompute reference
    before = prefix_kv(engine, ids[:-1])
    for i in range(1, 3):  # 2 x ~450 tokens through a 512-token pool
        run(engine, story(i))
    assert prefix_kv(engine, ids[:-1]).num_tokens < len(ids) - 1  # it left the device
    host = run(engine, prompt)
    details = host["meta_info"]["cached_tokens_details"]
    assert details["host"] > 250 and details["storage"] == 0
    assert host["meta_info"]["cached_tokens"] == sum(details.values()) == len(ids) - 1
    after = prefix_kv(engine, ids[:-1])  # back on the device: the very same bits
    assert all(torch.equal(a, b) for a, b in zip(before.arrays(), after.arrays(), strict=True))
    assert host["output_ids"] == first["output_ids"]
    # the last prompt token is recomputed in a 1-token step (the first run computed it in
    # the prompt's chunk): the fp32 torch path rounds that differently; the default native
    # path is batch-invariant (one int8 rounding at every step size): the same bits
    if engine.kind == "fp32-torch":
        assert max_delta(host, first) <= 1e-4
    else:
        assert engine.batch_invariant and logprobs(host) == logprobs(first)
    stats = check_accounting(engine)
    assert stats["host"]["promoted_tokens"] >= details["host"]
    assert stats["host"]["demoted_tokens"] > 0 and stats["host"]["hit_tokens"] > 0


def test_flush_per_tier(host_engine):
    engine = host_engine
    for i in range(2):  # the first one's prefix leaves the 512-token pool for the host
        run(engine, story(10 + i))
    assert engine.get_stats()["hicache"]["host"]["tokens"] > 0
    assert engine.flush_cache("host")
    assert engine.get_stats()["hicache"]["host"]["tokens"] == 0
    assert engine.flush_cache("device")  # the pool's prefixes go to the (empty) host tier
    stats = check_accounting(engine)
    assert stats["device"]["tokens"] == 0 and stats["host"]["tokens"] > 0
    with pytest.raises(ValueError, match="no storage tier"):
        engine.flush_cache("storage")
    with pytest.raises(ValueError, match="unknown cache tier"):
        engine.flush_cache("disk")
    assert engine.flush_cache()
    assert check_accounting(engine)["host"]["tokens"] == 0


def test_a_shared_template_keeps_its_hit_rate_with_a_host_tier(host_engine):
    """Four 420-token templates (3.3x the pool), cycled: without a host tier every visit
    would recompute (the pool holds fewer than two); with it most of each is promoted on
    the second round."""
    engine = host_engine
    assert engine.flush_cache()
    templates = [story(20 + t, 70) for t in range(4)]
    cached = prompt = 0
    for rnd in range(2):
        for t, text in enumerate(templates):
            out = engine.generate(text + f" Question {rnd}-{t}?", {"max_new_tokens": 2})
            if rnd:
                cached += out["meta_info"]["cached_tokens"]
                prompt += out["meta_info"]["prompt_tokens"]
    assert cached / prompt > 0.8
    check_accounting(engine)


def test_an_int8_pool_keeps_its_prefixes_quantized_in_the_host_and_disk_tiers(tmp_path):
    """--kv-cache-dtype int8 with both tiers on the native path: the host store and the
    files hold int8 rows and scales (the int8 bytes per token), and a prefix evicted to
    the host, or flushed and loaded from disk, comes back with the same bits, scales
    included, and gives the same tokens as its first (computing) run."""
    with Engine(max_total_tokens=POOL, kv_cache_dtype="int8", enable_hierarchical_cache=True,
                hicache_ratio=8, hicache_storage_backend="file",
                hicache_storage_dir=str(tmp_path), log_level="warning") as engine:
        pool, tiers = engine.runner.pool, engine.scheduler.kv.tiers
        assert pool.layout.startswith("int8/") and tiers.host.store.layout == pool.layout
        assert tiers.host.store.storage_dtype == torch.int8
        assert tiers.storage.codec.layout == pool.layout
        prompt = story(70)
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        first = run(engine, prompt)
        before = prefix_kv(engine, ids[:-1])
        assert before.k_scale and before.nbytes == (len(ids) - 1) * pool.token_bytes
        for i in range(1, 3):  # evict it to the host tier
            run(engine, story(70 + i))
        assert prefix_kv(engine, ids[:-1]).num_tokens < len(ids) - 1
        host = run(engine, prompt)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 250
        assert host["meta_info"]["cached_tokens"] == len(ids) - 1
        assert all(torch.equal(a, b) for a, b in
                   zip(before.arrays(), prefix_kv(engine, ids[:-1]).arrays(), strict=True))
        assert host["output_ids"] == first["output_ids"]
        assert engine.flush_cache("device") and engine.flush_cache("host")
        disk = run(engine, prompt)
        whole = (len(ids) - 1) // STORAGE_BLOCK_TOKENS * STORAGE_BLOCK_TOKENS
        assert disk["meta_info"]["cached_tokens_details"]["storage"] == whole
        back = prefix_kv(engine, ids[:whole])
        assert all(torch.equal(a, b) for a, b in
                   zip(before.slice(0, whole).arrays(), back.arrays(), strict=True))
        assert disk["output_ids"] == first["output_ids"]
        check_accounting(engine)


# ---------------------------------------------------------------- the disk tier


FP32 = {"dtype": "float32", "native_activations": "fp32"}


def storage_engine(directory: Path, **kwargs) -> Engine:
    """A disk tier over ``directory``; otherwise the defaults (the native path)."""
    options = {"max_total_tokens": POOL, "enable_hierarchical_cache": True,
               "hicache_storage_backend": "file", "hicache_storage_dir": str(directory),
               "log_level": "warning", **kwargs}
    return Engine(**options)


def same(a: dict, b: dict) -> bool:
    """The same answer, bit for bit: token ids and output logprobs."""
    lps = [out["meta_info"]["output_token_logprobs"] for out in (a, b)]
    assert all(len(lp) == len(out["output_ids"]) > 0 for lp, out in zip(lps, (a, b)))
    return a["output_ids"] == b["output_ids"] and lps[0] == lps[1]


def test_restart_serves_the_prefix_from_disk_and_skips_damaged_blocks(tmp_path):
    """On the defaults (batch-invariant: every step native, one int8 rounding at every step
    size) a disk hit, a restarted engine's disk hit, a partial hit past a damaged block and
    a miss past a truncated one are each the first (computing) run, bit for bit: the K/V
    come back as they were written and the rest is computed with the same rounding in
    steps of any size, so the logprobs compare with == by construction."""
    prompt = story(30, 50)
    with storage_engine(tmp_path) as a:
        assert a.batch_invariant
        first = run(a, prompt)
        n = first["meta_info"]["prompt_tokens"]
        whole = min(n // STORAGE_BLOCK_TOKENS * STORAGE_BLOCK_TOKENS, n - 1)
        assert a.flush_cache("device") and a.flush_cache("host")
        from_disk = run(a, prompt)  # the shape of a hit after a restart
        assert from_disk["meta_info"]["cached_tokens_details"]["storage"] == whole
        check_accounting(a)
        fingerprint = a.scheduler.kv.tiers.storage.fingerprint
        block_dir = a.scheduler.kv.tiers.storage.dir
    assert len(list(block_dir.glob("*.kv"))) >= whole // STORAGE_BLOCK_TOKENS
    with storage_engine(tmp_path) as b:  # a restart: a new engine over the same directory
        again = run(b, prompt)
        details = again["meta_info"]["cached_tokens_details"]
        assert details == {"device": 0, "host": 0, "storage": whole}
        assert again["meta_info"]["cached_tokens"] == whole
        assert same(from_disk, first) and same(again, from_disk)
        ids = b.tokenizer.encode(prompt, add_special_tokens=False)
        keys = block_keys(fingerprint, ids, STORAGE_BLOCK_TOKENS)
        path = block_dir / (keys[2].hex() + ".kv")
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10  # one flipped bit inside block 2's K/V
        path.write_bytes(bytes(data))
        assert b.flush_cache("device") and b.flush_cache("host")
        damaged = run(b, prompt)
        assert damaged["meta_info"]["cached_tokens_details"]["storage"] == \
            2 * STORAGE_BLOCK_TOKENS
        assert same(damaged, first)
        stats = check_accounting(b)["storage"]
        assert stats["corrupt_files"] == 1
        path0 = block_dir / (keys[0].hex() + ".kv")
        path0.write_bytes(path0.read_bytes()[:1000])  # truncated
        assert b.flush_cache("device") and b.flush_cache("host")
        truncated = run(b, prompt)
        assert truncated["meta_info"]["cached_tokens"] == 0
        assert same(truncated, first)
        assert check_accounting(b)["storage"]["corrupt_files"] == 2


def test_another_dtype_never_reads_the_blocks(tmp_path):
    prompt = story(40, 60)
    with storage_engine(tmp_path, **FP32) as fp32:
        reference = run(fp32, prompt)
        fp32_dir = fp32.scheduler.kv.tiers.storage.dir
    with storage_engine(tmp_path, **{**FP32, "dtype": "bfloat16"}) as bf16:
        storage = bf16.scheduler.kv.tiers.storage
        assert storage.dir != fp32_dir and storage.num_blocks == 0
        ids = bf16.tokenizer.encode(prompt, add_special_tokens=False)
        # fp32 blocks copied in under the names bf16 would look for
        fp32_keys = block_keys(fp32_dir_fingerprint(fp32_dir, tmp_path), ids,
                               STORAGE_BLOCK_TOKENS)
        for theirs, ours in zip(fp32_keys, block_keys(storage.fingerprint, ids,
                                                        STORAGE_BLOCK_TOKENS)):
            (storage.dir / (ours.hex() + ".kv")).write_bytes(
                (fp32_dir / (theirs.hex() + ".kv")).read_bytes())
        out = run(bf16, prompt)
        assert out["meta_info"]["cached_tokens"] == 0
        assert out["output_ids"][:4] == reference["output_ids"][:4]
        assert bf16.get_stats()["hicache"]["storage"]["corrupt_files"] == 1


def fp32_dir_fingerprint(block_dir: Path, root: Path) -> bytes:
    """The fingerprint behind a block directory (its files' headers carry it)."""
    from radixlm.runtime.hicache.storage import _HEADER

    sample = next(block_dir.glob("*.kv")).read_bytes()[:_HEADER.size]
    return _HEADER.unpack(sample)[1]


def test_accounting_across_moves_promotions_aborts_and_drafts(tmp_path):
    """Mixed traffic on the native path (speculative drafts on) through a small pool with
    both tiers: concurrent requests over shared templates, some aborted mid-stream."""
    with Engine(max_total_tokens=POOL, enable_hierarchical_cache=True, hicache_ratio=3,
                hicache_storage_backend="file", hicache_storage_dir=str(tmp_path),
                log_level="warning") as engine:
        templates = [story(50 + t, 45) for t in range(5)]
        errors: list[BaseException] = []

        def client(i: int) -> None:
            try:
                text = templates[i % 5] + f" Now repeat entry{i}x1 entry{i}x2:"
                if i % 4 == 3:  # abort after the first chunk
                    for _ in engine.generate(text, {"max_new_tokens": 40}, stream=True):
                        break
                else:
                    engine.generate(text, {"temperature": 0.7 * (i % 2),
                                           "max_new_tokens": 24, "seed": i})
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        for wave in range(2):
            threads = [threading.Thread(target=client, args=(wave * 12 + i,))
                       for i in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            wait_until(lambda: not engine.scheduler.has_work(), "the engine to go idle", 60)
            check_accounting(engine)
        assert not errors
        stats = engine.get_stats()
        tiers = stats["hicache"]
        assert tiers["host"]["promoted_tokens"] > 0 and tiers["host"]["demoted_tokens"] > 0
        assert tiers["storage"]["written_blocks"] > 0
        assert stats.get("spec_draft_tokens_total", 0) > 0  # drafts were verified and freed


# ---------------------------------------------------------------- a real server


class HiServer:
    def __init__(self, directory: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--port", str(self.port),
               "--max-total-tokens", str(POOL),
               "--enable-hierarchical-cache", "--hicache-storage-backend", "file",
               "--hicache-storage-dir", str(directory), "--log-level", "warning"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log_path, self.log = log, open(log, "a")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_up(self) -> HiServer:
        def up() -> bool:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            return health_ok(self.url)

        wait_until(up, "the server to start", limit_s=300, interval=STARTUP_POLL_S)
        return self

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(120)
        self.log.close()
        return code


def metric(text: str, name: str, tier: str) -> float:
    """The value of ``name{tier="..."}`` in a Prometheus text page."""
    head = f'{name}{{tier="{tier}"}} '
    return float(next(ln for ln in text.splitlines() if ln.startswith(head)).split()[-1])


def test_servers_share_a_storage_dir_and_a_restarted_one_serves_from_disk(tmp_path):
    """Two live servers write the same prefix and their own to one directory at once and
    stop gracefully (writing what is queued); a third, started on it afterwards, serves all
    three from disk with the same tokens, counts it in /metrics as the engine does, and
    flushes the disk tier on request. On the defaults (batch-invariant) a disk hit's
    logprobs are the cold run's bits, across processes too."""
    store = tmp_path / "kv"
    store.mkdir()
    bodies = {name: {"text": story(i, 50), "sampling_params": GREEDY, "return_logprob": True}
              for i, name in ((70, "shared"), (71, "a"), (72, "b"))}
    a, b = HiServer(store, tmp_path / "a.log"), HiServer(store, tmp_path / "b.log")
    try:
        a.wait_up(), b.wait_up()  # (started together: their start-ups overlap)
        def serve(srv: HiServer, names: tuple[str, ...]) -> dict:  # one at a time each
            return {n: httpx.post(srv.url + "/generate", json=bodies[n], timeout=300).json()
                    for n in names}

        with ThreadPoolExecutor(2) as pool:  # the two servers write at the same time
            runs = [pool.submit(serve, a, ("shared", "a")), pool.submit(serve, b, ("b", "shared"))]
            first, second = (job.result() for job in runs)
        assert same(first["shared"], second["shared"])
        assert second["b"]["meta_info"]["cached_tokens_details"] == {  # b's first: cold
            "device": 0, "host": 0, "storage": 0}
        cold = {**first, **second}
    finally:
        assert a.stop() == 0 and b.stop() == 0  # a graceful stop writes what is queued
    server = HiServer(store, tmp_path / "c.log")
    try:
        server.wait_up()
        from_disk = 0
        for name, body in bodies.items():
            meta = (warm := httpx.post(server.url + "/generate", json=body,
                                       timeout=300).json())["meta_info"]
            assert meta["cached_tokens_details"]["storage"] >= 3 * STORAGE_BLOCK_TOKENS, name
            # (the prompts share their first tokens, "Log 7", a device hit after the first)
            assert meta["cached_tokens"] == sum(meta["cached_tokens_details"].values()), name
            assert same(warm, cold[name]), name
            from_disk += meta["cached_tokens_details"]["storage"]
            if name == "shared":  # promoted to the device (later ones push it to the host)
                tree = httpx.get(server.url + "/radix_tree", timeout=30).json()
                assert {n["tier"] for n in tree["nodes"][1:]} == {"device"}
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        assert metric(metrics, "radixlm_hicache_hit_tokens_total", "storage") == from_disk
        assert metric(metrics, "radixlm_hicache_promoted_tokens_total", "storage") == from_disk
        assert metric(metrics, "radixlm_hicache_bytes", "storage") > 0
        stats = httpx.get(server.url + "/get_server_info", timeout=30).json()["stats"]
        assert stats["hicache"]["storage"]["corrupt_files"] == 0
        for tier in ("device", "host"):  # every per-tier figure as the engine counts it
            for key, figure in stats["hicache"][tier].items():
                name = "radixlm_hicache_" + key + ("_total" if key.endswith("tokens")
                                                   and key != "tokens" else "")
                assert metric(metrics, name, tier) == figure, (name, tier)
        oai = httpx.post(server.url + "/v1/completions", timeout=300, json={
            "model": "m", "prompt": bodies["a"]["text"], "max_tokens": 2}).json()
        assert oai["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert httpx.post(server.url + "/flush_cache?tier=disk", timeout=30).status_code == 400
        assert httpx.post(server.url + "/flush_cache?teir=host", timeout=30).status_code == 400
        assert httpx.post(server.url + "/flush_cache?tier=storage",
                          timeout=30).status_code == 200
        assert not list(store.rglob("*.kv"))
    finally:
        assert server.stop() == 0
