"""Standing stress suite for the HTTP server (`make stress`; `--quick` runs in `make test`).

Starts `radixlm serve` on 127.0.0.1 (or targets `--url`), then, every loop bounded in count
and time:

1. the bad-input catalogue (`benchmarks/bad_inputs.json`): each case must get its status,
   and /health is timed while a 5 MB request is in flight;
2. schemathesis over /openapi.json: generated cases for every operation (generation
   lengths capped so valid cases stay short), counting 5xx;
3. N concurrent streaming clients for T seconds on /generate, /v1/completions and
   /v1/chat/completions, a share of them disconnecting after the first token; a 429 must
   carry Retry-After (the client waits that long, jittered);
4. open-loop arrivals at 2x the throughput measured in 3, for TTFT p50/p99 under overload;
5. idle: KV held by requests (used - radix tree) and requests left must be 0; RSS after;
6. SIGTERM under load (only for a server it started): in-flight streams finish, exit 0.

`--soak MINUTES` runs a memory soak instead: the server (started with the hierarchical
cache: a host tier and a disk tier in a temporary directory, unless `--no-tiers`) gets
mixed streaming traffic (agent templates reused across requests, unique prompts that fill
and evict the tiers, chats, a share of clients disconnecting) first as a warm-up until the
KV pool and the host tier are full (or `--soak-warmup` minutes pass), then for MINUTES
more while its RSS is sampled every `--soak-sample` seconds: the report gives RSS after the
warm-up (the first sample, under load), the highest and the last sample, and the growth of
the highest over the first.

Prints the host (CPU model and ISA flags), a table, and a JSON summary (`--json PATH`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from radixlm.native.build import host_info, host_line

HERE = Path(__file__).parent
CAP_KEYS = ("max_new_tokens", "max_tokens", "max_completion_tokens")
WORDS = ("alpha beta gamma delta radix cache token batch prefix stream queue engine model "
         "kernel schema grammar sample decode extend").split()


# ---------------------------------------------------------------- helpers


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cap_lengths(body: Any, cap: int, path: str) -> Any:
    """Clamp (or set, where absent) the generation length of a generated body, so a valid
    case finishes quickly: schemathesis tests validation, not long generations."""
    def clamp(d: dict[str, Any], key: str) -> None:
        value = d.get(key)
        if value is None:
            d[key] = cap
        elif isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
            d[key] = cap  # floats too: 1e14 is a valid integer to pydantic

    if not isinstance(body, dict):
        return body
    if path.startswith("/v1/"):
        if body.get("max_completion_tokens") is not None:
            clamp(body, "max_completion_tokens")
        else:
            clamp(body, "max_tokens")
    elif path == "/generate":
        sp = body.get("sampling_params")
        if sp is None:
            body["sampling_params"] = {"max_new_tokens": cap}
        for d in sp if isinstance(sp, list) else [sp]:
            if isinstance(d, dict):
                clamp(d, "max_new_tokens")
    return body


@dataclass
class Tally:
    """Outcomes of one phase."""

    cases: int = 0
    s5xx: int = 0
    r429: int = 0
    r429_retry_after: int = 0
    other_errors: int = 0
    transport_errors: int = 0
    inband_errors: int = 0
    disconnects: int = 0
    completed: int = 0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)  # a few failures, for the report

    def note(self, what: str) -> None:
        if len(self.samples) < 8:
            self.samples.append(what[:300])

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("ttft", "e2e")}
        for name in ("ttft", "e2e"):
            values = getattr(self, name)
            out[f"{name}_p50_s"] = pct(values, 50)
            out[f"{name}_p99_s"] = pct(values, 99)
        return out


# ---------------------------------------------------------------- the server


class Server:
    """`radixlm serve` in a child process (or an existing server at `url`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.proc: subprocess.Popen | None = None
        self.store = None
        self.given_pid: int | None = args.pid
        if args.url:
            self.url = args.url.rstrip("/")
            return
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--model", args.model,
               "--host", "127.0.0.1", "--port", str(port),
               "--max-queued-requests", str(args.max_queued),
               "--request-timeout", str(args.request_timeout),
               "--shutdown-timeout", "30", "--log-level", "warning"]
        if args.max_running:
            cmd += ["--max-running-requests", str(args.max_running)]
        if args.max_total_tokens:
            cmd += ["--max-total-tokens", str(args.max_total_tokens)]
        self.store: str | None = None
        if args.soak and not args.no_tiers:
            self.store = tempfile.mkdtemp(prefix="radixlm-soak-kv-")
            cmd += ["--enable-hierarchical-cache", "--hicache-ratio", str(args.hicache_ratio),
                    "--hicache-storage-backend", "file", "--hicache-storage-dir", self.store,
                    "--hicache-storage-size", str(args.hicache_storage_size)]
        self.log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)

    @property
    def pid(self) -> int | None:
        return self.given_pid if self.proc is None else self.proc.pid

    def wait_up(self, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server did not come up in {limit_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if self.store is not None:
            shutil.rmtree(self.store, ignore_errors=True)


# ---------------------------------------------------------------- 1. bad inputs


async def bad_inputs(url: str, big_mb: float) -> tuple[Tally, list[dict[str, Any]], float | None]:
    """Every catalogue case must get its expected status. Returns the tally, the
    mismatches, and the slowest /health answer while a 5 MB request was in flight."""
    cat = json.loads((HERE / "bad_inputs.json").read_text())["cases"]
    big = "a " * int(big_mb * 1024 * 1024 / 2)
    stops = ",".join(['"x"'] * 10_000)
    tally, wrong = Tally(), []
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        for case in cat:
            body = case["body"].replace("@BIG@", big).replace("@STOPS@", stops)
            tally.cases += 1
            try:
                r = await c.post(case["path"], content=body.encode("utf-8", "surrogatepass"),
                                 headers={"content-type": "application/json"})
            except httpx.HTTPError as exc:
                tally.transport_errors += 1
                wrong.append({"case": case["name"], "got": repr(exc)})
                continue
            if r.status_code >= 500:
                tally.s5xx += 1
            if r.status_code != case["expect"]:
                tally.other_errors += 1
                wrong.append({"case": case["name"], "expect": case["expect"],
                              "got": r.status_code, "body": r.text[:200]})
        # /health while a 5 MB request is in flight
        big_body = json.dumps({"model": "m", "prompt": big}).encode()
        task = asyncio.ensure_future(c.post("/v1/completions", content=big_body,
                                            headers={"content-type": "application/json"}))
        worst = 0.0
        for _ in range(40):
            if task.done():
                break
            t0 = time.perf_counter()
            await c.get("/health")
            worst = max(worst, time.perf_counter() - t0)
            await asyncio.sleep(0.02)
        await task
    return tally, wrong, worst


# ---------------------------------------------------------------- 2. schemathesis


def schema_cases(url: str, cases: int, cap: int, limit_s: float, seed: int) -> Tally:
    """schemathesis-generated cases for every operation of /openapi.json."""
    import warnings

    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    warnings.simplefilter("ignore")
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    heavy = {"/generate", "/v1/completions", "/v1/chat/completions"}
    weights = {(o.method, o.path): (4 if o.path in heavy else 1) for o in ops}
    total_w = sum(weights.values())
    tally, end = Tally(), time.monotonic() + limit_s
    session = httpx.Client(base_url=url, timeout=120)
    for op in ops:
        n = max(1, math.ceil(cases * weights[(op.method, op.path)] / total_w))

        @hseed(seed)
        @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=False)
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            if time.monotonic() > end:
                return
            body = cap_lengths(case.body, cap, case.path) if case.body is not None else None
            tally.cases += 1
            try:
                kw: dict[str, Any] = {"params": case.query or None}
                if body is not None:
                    kw["content"] = json.dumps(body).encode("utf-8", "surrogatepass")
                    kw["headers"] = {"content-type": "application/json"}
                r = session.request(case.method, case.formatted_path, **kw)
            except httpx.HTTPError as exc:
                tally.transport_errors += 1
                tally.note(f"{case.method} {case.path}: {exc!r}")
                return
            except (TypeError, ValueError):  # a body JSON cannot carry (e.g. NaN keys)
                tally.cases -= 1
                return
            if r.status_code >= 500:
                tally.s5xx += 1
                tally.note(f"{case.method} {case.path} {r.status_code}: {body!r:.150} -> "
                           f"{r.text[:150]}")
            elif r.status_code == 429:
                tally.r429 += 1
                tally.r429_retry_after += "retry-after" in r.headers

        run()
    session.close()
    return tally


# ---------------------------------------------------------------- 3/4. streaming load


def _request(rng: random.Random, max_tokens: int) -> tuple[str, dict[str, Any]]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60)))
    prefix = f"Shared system preamble number {rng.randint(0, 3)}. "  # some prefix sharing
    route = rng.choice(("/generate", "/v1/completions", "/v1/chat/completions"))
    if route == "/generate":
        return route, {"text": prefix + words, "stream": True,
                       "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.7}}
    if route == "/v1/completions":
        return route, {"model": "m", "prompt": prefix + words, "stream": True,
                       "max_tokens": max_tokens, "temperature": 0.7}
    return route, {"model": "m", "stream": True, "max_tokens": max_tokens,
                   "messages": [{"role": "system", "content": prefix},
                                {"role": "user", "content": words}]}


def _has_token(route: str, event: dict[str, Any]) -> bool:
    if route == "/generate":
        return bool(event.get("output_ids"))
    for choice in event.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def one_stream(c: httpx.AsyncClient, rng: random.Random, tally: Tally, max_tokens: int,
                     disconnect: bool, retry: bool, make: Any = _request) -> float:
    """One streamed request (``make(rng, max_tokens)`` -> route, body); returns how long to
    wait before the next (Retry-After)."""
    route, body = make(rng, max_tokens)
    t0 = time.perf_counter()
    tally.cases += 1
    try:
        async with c.stream("POST", route, json=body) as r:
            if r.status_code == 429:
                tally.r429 += 1
                after = r.headers.get("retry-after")
                tally.r429_retry_after += after is not None
                return float(after or 1) * rng.uniform(0.5, 1.5) if retry else 0.0
            if r.status_code >= 500:
                tally.s5xx += 1
                tally.note(f"{route} {r.status_code}: {(await r.aread())[:200]!r}")
                return 0.0
            if r.status_code != 200:
                tally.other_errors += 1
                tally.note(f"{route} {r.status_code}: {(await r.aread())[:200]!r}")
                return 0.0
            first = None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    tally.inband_errors += 1
                    tally.note(f"{route} in-band: {data[:200]}")
                    return 0.0
                if first is None and _has_token(route, event):
                    first = time.perf_counter() - t0
                    tally.ttft.append(first)
                    if disconnect:
                        tally.disconnects += 1
                        return 0.0  # leaving the block closes the connection mid-stream
            tally.completed += 1
            tally.e2e.append(time.perf_counter() - t0)
    except httpx.HTTPError as exc:
        tally.transport_errors += 1
        tally.note(f"{route}: {exc!r}")
    return 0.0


async def closed_loop(url: str, clients: int, duration: float, max_tokens: int,
                      disconnect_rate: float, seed: int, timeout: float,
                      make: Any = _request, until: Any = None) -> Tally:
    """`clients` clients each streaming one request after another for `duration` s (or
    until the coroutine `until` returns, if given, whichever is first)."""
    tally, end = Tally(), time.monotonic() + duration
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as c:
        async def client(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < end:
                wait = await one_stream(c, rng, tally, max_tokens,
                                        rng.random() < disconnect_rate, retry=True, make=make)
                await asyncio.sleep(min(wait, max(end - time.monotonic(), 0)))

        async def stopper() -> None:
            nonlocal end
            await until()
            end = time.monotonic()

        await asyncio.gather(*(client(i) for i in range(clients)),
                             *([stopper()] if until is not None else []))
    return tally


async def open_loop(url: str, rate: float, duration: float, max_tokens: int, seed: int,
                    timeout: float, max_inflight: int = 1024) -> Tally:
    """Poisson arrivals at `rate` per second for `duration` s (at most `max_inflight` open)."""
    tally, rng = Tally(), random.Random(seed)
    limits = httpx.Limits(max_connections=max_inflight, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as c:
        tasks: set[asyncio.Task] = set()
        end = time.monotonic() + duration
        while time.monotonic() < end:
            if len(tasks) < max_inflight:
                task = asyncio.ensure_future(one_stream(c, random.Random(rng.random()), tally,
                                                        max_tokens, False, retry=False))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(rng.expovariate(rate))
        if tasks:
            await asyncio.wait(tasks, timeout=timeout + 30)
    return tally


# ---------------------------------------------------------------- 5/6. idle and SIGTERM


def idle_state(url: str, limit_s: float = 60.0) -> dict[str, Any]:
    """Wait (bounded) until nothing runs or waits; report KV held by requests."""
    end = time.monotonic() + limit_s
    while True:
        stats = httpx.get(url + "/get_server_info", timeout=30).json()["stats"]
        busy = stats["num_running"] + stats["num_waiting"] + stats.get("num_grammar_pending", 0)
        if busy == 0 or time.monotonic() > end:
            break
        time.sleep(0.5)
    return {"requests_left": busy, "kv_held_by_requests": stats["kv_used_tokens"]
            - stats["tree_size"], "kv_used_tokens": stats["kv_used_tokens"],
            "tree_size": stats["tree_size"]}


async def sigterm_under_load(server: Server, streams: int, max_tokens: int) -> dict[str, Any]:
    """Open `streams` streams, SIGTERM the server after their first tokens; every stream must
    end with [DONE] and the server exit 0."""
    assert server.proc is not None
    done = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
        started = asyncio.Event()
        count = [0]

        async def stream(i: int) -> None:
            nonlocal done
            body = {"text": f"Count slowly {i}:", "stream": True,
                    "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True}}
            try:
                async with c.stream("POST", "/generate", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            count[0] += 1
                            if count[0] >= streams:
                                started.set()
                        if line == "data: [DONE]":
                            done += 1
            except httpx.HTTPError:
                pass

        tasks = [asyncio.ensure_future(stream(i)) for i in range(streams)]
        try:
            await asyncio.wait_for(started.wait(), 120)
        except TimeoutError:
            pass
        t0 = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.wait(tasks, timeout=90)
    try:
        code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    return {"streams": streams, "finished_with_done": done, "exit_code": code,
            "shutdown_s": round(time.perf_counter() - t0, 2)}


# ---------------------------------------------------------------- 7. soak


def _template(i: int) -> str:
    """Agent template i: a fixed instruction block of 200-500 tokens reused by requests."""
    rng = random.Random(10_000 + i)
    return (f"You are agent {i}. Follow these rules. "
            + " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 400))) + "\n")


def _soak_request(rng: random.Random, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """Half reuse one of 32 agent templates (hits in every tier), a third are unique
    prompts of up to ~600 tokens (they fill the tiers and push others down), the rest the
    short chat/completion mix of the streaming phase."""
    kind = rng.random()
    if kind < 0.5:
        text = _template(rng.randrange(32)) + "Task: " + " ".join(
            rng.choice(WORDS) for _ in range(rng.randint(4, 30)))
    elif kind < 0.83:
        text = f"Unique {rng.random()}: " + " ".join(
            rng.choice(WORDS) for _ in range(rng.randint(50, 500)))
    else:
        return _request(rng, max_tokens)
    return "/generate", {"text": text, "stream": True,
                         "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.7}}


def _full(stats: dict[str, Any]) -> bool:
    """The KV pool (and the host tier, with tiers) hold at least 90% of their capacity."""
    pool = stats["kv_used_tokens"] >= 0.9 * stats["kv_capacity"]
    host = (stats.get("hicache") or {}).get("host")
    return pool and (host is None or host["bytes"] >= 0.9 * host["capacity_bytes"])


async def soak(server: Server, args: argparse.Namespace, timeout: float) -> dict[str, Any]:
    """Warm-up until the tiers are full, then `args.soak` minutes of mixed traffic with RSS
    sampled; returns the figures (see the module docstring)."""
    async def stats() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            return (await c.get("/get_server_info")).json()["stats"]

    async def filled() -> None:
        while not _full(await stats()):
            await asyncio.sleep(5)

    t0 = time.monotonic()
    warm = await closed_loop(server.url, args.soak_clients, args.soak_warmup * 60,
                             args.max_tokens, args.disconnect_rate, args.seed, timeout,
                             make=_soak_request, until=filled)
    warm_s = time.monotonic() - t0
    full = _full(await stats())
    idle_after_warmup = rss_mb(server.pid)
    samples: list[dict[str, Any]] = []

    async def sampler() -> None:
        start = time.monotonic()
        while True:
            await asyncio.sleep(args.soak_sample)
            s = await stats()
            tiers = s.get("hicache") or {}
            samples.append({"t_s": round(time.monotonic() - start), "rss_mb": rss_mb(server.pid),
                            "kv_used": s["kv_used_tokens"],
                            **{f"{t}_mb": round(v["bytes"] / 1e6) for t, v in tiers.items()}})

    task = asyncio.ensure_future(sampler())
    load = await closed_loop(server.url, args.soak_clients, args.soak * 60, args.max_tokens,
                             args.disconnect_rate, args.seed + 1, timeout, make=_soak_request)
    task.cancel()
    rss = [x["rss_mb"] for x in samples if x["rss_mb"] is not None]
    base, peak = (rss[0], max(rss)) if rss else (None, None)  # base: under load, warmed up
    final = await stats()
    return {"warmup_s": round(warm_s), "warmup_filled_tiers": full,
            "rss_mb_idle_after_warmup": idle_after_warmup, "rss_mb_after_warmup": base,
            "rss_mb_max": peak, "rss_mb_last": rss[-1] if rss else None,
            "rss_growth_pct": (round(100 * (peak - base) / base, 2)
                               if base and peak is not None else None),
            "minutes": args.soak, "samples": samples, "hicache": final.get("hicache"),
            "cache_hit_rate": final.get("cache_hit_rate"),
            "warmup": warm.summary(), "load": load.summary()}


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="target a running server instead of starting one")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--max-queued", type=int, default=64)
    p.add_argument("--max-running", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--cases", type=int, default=3000, help="schemathesis cases")
    p.add_argument("--schema-time", type=float, default=900.0, help="schemathesis time cap, s")
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--duration", type=float, help="streaming phase, s (120; --quick: 8)")
    p.add_argument("--overload-duration", type=float, help="s (60; --quick: 6)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per streamed request")
    p.add_argument("--disconnect-rate", type=float, default=0.1)
    p.add_argument("--big-mb", type=float, default=5.0)
    p.add_argument("--sigterm-streams", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="bounded variant (~1 min): 120 cases, 16 clients x 8 s, 6 s overload")
    p.add_argument("--skip", default="", help="comma list of phases to skip: "
                   "bad,schema,stream,overload,sigterm")
    p.add_argument("--server-log", help="write the server's output here")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--pid", type=int, help="with --url: the server's pid (for RSS)")
    p.add_argument("--soak", type=float, default=0.0,
                   help="minutes of the memory soak instead of the other phases (0: off)")
    p.add_argument("--soak-warmup", type=float, default=10.0,
                   help="most minutes of warm-up before the soak (ends when tiers are full)")
    p.add_argument("--soak-clients", type=int, default=8)
    p.add_argument("--soak-sample", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--no-tiers", action="store_true",
                   help="soak without the hierarchical cache")
    p.add_argument("--hicache-ratio", type=float, default=2.0)
    p.add_argument("--hicache-storage-size", type=float, default=2.0, help="GB of disk tier")
    args = p.parse_args(argv)
    given = {"duration": args.duration, "overload_duration": args.overload_duration}
    args.duration, args.overload_duration = 120.0, 60.0
    if args.quick:
        args.cases, args.clients, args.duration = min(args.cases, 120), 16, 8.0
        args.overload_duration, args.schema_time = 6.0, 60.0
        args.sigterm_streams, args.max_tokens = 4, 8
        args.disconnect_rate = max(args.disconnect_rate, 0.3)  # some disconnect, surely
    for name, value in given.items():  # durations given on the command line win
        if value is not None:
            setattr(args, name, value)
    return args


def progress(what: str, t0: float) -> None:
    print(f"[stress] {what} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    report: dict[str, Any] = {"host": host_info(), "args": vars(args)}
    server = Server(args)
    t_start = time.monotonic()
    try:
        server.wait_up(600)
        progress("server up", t_start)
        httpx.post(server.url + "/generate", timeout=120, json={
            "text": "warm up", "sampling_params": {"max_new_tokens": 2}})
        report["rss_mb_before"] = rss_mb(server.pid)
        timeout = args.request_timeout + 30
        if args.soak:
            report["soak"] = asyncio.run(soak(server, args, timeout))
            report["idle"] = idle_state(server.url)
            return _finish(report, args)
        phases: dict[str, Tally] = {}
        if "bad" not in skip:
            tally, wrong, worst = asyncio.run(bad_inputs(server.url, args.big_mb))
            phases["bad inputs"], report["bad_input_mismatches"] = tally, wrong
            report["health_worst_s_during_big_request"] = worst
            progress("bad inputs done", t_start)
        if "schema" not in skip:
            phases["schemathesis"] = schema_cases(server.url, args.cases, 4, args.schema_time,
                                                  args.seed)
            progress(f"schemathesis done: {phases['schemathesis'].summary()}", t_start)
        if "stream" not in skip:
            t0 = time.monotonic()
            phases["streaming"] = asyncio.run(closed_loop(
                server.url, args.clients, args.duration, args.max_tokens, args.disconnect_rate,
                args.seed, timeout))
            elapsed = time.monotonic() - t0
            report["throughput_rps"] = phases["streaming"].completed / max(elapsed, 1e-9)
            progress(f"streaming done: {phases['streaming'].summary()}", t_start)
        if "overload" not in skip:
            rate = 2 * max(report.get("throughput_rps", 2.0), 0.5)
            report["overload_rate_rps"] = rate
            phases["overload 2x"] = asyncio.run(open_loop(
                server.url, rate, args.overload_duration, args.max_tokens, args.seed, timeout))
        report["idle"] = idle_state(server.url)
        report["rss_mb_after"] = rss_mb(server.pid)
        if "sigterm" not in skip and server.proc is not None:
            report["sigterm"] = asyncio.run(sigterm_under_load(
                server, args.sigterm_streams, 64))
        report["phases"] = {k: v.summary() for k, v in phases.items()}
    finally:
        server.stop()
    return _finish(report, args)


def _finish(report: dict[str, Any], args: argparse.Namespace) -> int:
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def print_report(report: dict[str, Any]) -> None:
    print(host_line(report["host"]))
    cols = ("cases", "s5xx", "r429", "r429_retry_after", "other_errors", "inband_errors",
            "transport_errors", "disconnects", "completed", "ttft_p50_s", "ttft_p99_s",
            "e2e_p50_s", "e2e_p99_s")
    print(f"{'phase':<14}" + "".join(f"{c:>17}" for c in cols))
    for name, s in report.get("phases", {}).items():
        print(f"{name:<14}" + "".join(f"{_fmt(s.get(c)):>17}" for c in cols))
    for key in ("health_worst_s_during_big_request", "throughput_rps", "overload_rate_rps",
                "idle", "rss_mb_before", "rss_mb_after", "sigterm", "bad_input_mismatches"):
        if key in report:
            print(f"{key}: {_fmt(report[key])}")
    soak_report = report.get("soak")
    if soak_report:
        for key in ("minutes", "warmup_s", "warmup_filled_tiers", "rss_mb_idle_after_warmup",
                    "rss_mb_after_warmup", "rss_mb_max", "rss_mb_last", "rss_growth_pct",
                    "cache_hit_rate"):
            print(f"soak {key}: {_fmt(soak_report[key])}")
        print(f"{'t_s':>6} {'rss_mb':>8} {'kv_used':>8}  tier MB")
        for x in soak_report["samples"]:
            tiers = " ".join(f"{k}={v}" for k, v in x.items() if k.endswith("_mb")
                             and k != "rss_mb")
            print(f"{x['t_s']:>6} {_fmt(x['rss_mb']):>8} {x['kv_used']:>8}  {tiers}")
    for name, s in report.get("phases", {}).items():
        for sample in s.get("samples", []):
            print(f"  [{name}] {sample}")
    print(json.dumps({k: report[k] for k in report if k != "args"}, default=str))


if __name__ == "__main__":
    sys.exit(main())
