"""Scale-out: data parallel behind SGLang's router, and tensor-parallel step time.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--skip-dp] [--skip-tp] [--out f.json]

Data parallel. The few-shot and multi-turn workloads of ``bench_prefix.py`` are sent over
HTTP, one request per prompt (a thread each, up to 16 at once; turn k+1 of a conversation
after turn k's answer), to three servers started one after the other on loopback:
``single`` (one replica, the reference hit rate), ``dp2_cache_aware`` and
``dp2_round_robin`` (``radixlm serve --dp-size 2 --router-policy ...``). Reported per
workload and server: ``hit_rate`` (sum of cached_tokens / sum of prompt_tokens over the
responses), ``output_tok_s`` and ``req_s`` over the wall time. Prompts are sent as text
(the router routes by text). Targets: cache-aware hit rate within 5 points of single on
few-shot; >= 1.3x the round-robin hit rate on multi-turn.

Throughput here is not a scale-out measurement: on a 2-core host two replicas share the
same two cores, so dp=2 cannot be faster than one replica; the hit rate is what the router
policy decides and what carries over to a host with a device per replica.

Tensor parallel. One fp32 engine with tp_size=1 and one with tp_size=2 (gloo) are both
loaded; rounds alternate between them (this host's speed drifts) and each round decodes a
batch of prompts; ``step_ms`` is wall time / engine steps, median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefix import FewShot, MultiTurnChat  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVERS = {"single": (1, "cache_aware"), "dp2_cache_aware": (2, "cache_aware"),
           "dp2_round_robin": (2, "round_robin")}


def host_info() -> dict:
    """CPU model and the ISA flags that decide kernel speed."""
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return {"cpu": model, "cores": os.cpu_count(), "isa": isa}


class HttpEngine:
    """The `generate(prompts, params)` the workloads' recorder calls, over HTTP: one POST
    per prompt (as text), concurrently."""

    def __init__(self, url: str, tok) -> None:
        self.url, self.tok = url, tok
        self.results: list[dict] = []
        self._lock = threading.Lock()

    def _one(self, ids: list[int], params: dict) -> dict:
        body = {"text": self.tok.decode(ids), "sampling_params": params}
        r = requests.post(self.url + "/generate", json=body, timeout=600)
        r.raise_for_status()
        out = r.json()
        with self._lock:
            self.results.append(out)
        return out

    def generate(self, prompts: list[list[int]], params: dict) -> list[dict]:
        with ThreadPoolExecutor(min(len(prompts), 16)) as pool:
            return list(pool.map(lambda ids: self._one(ids, params), prompts))


def free_port() -> int:
    from radixlm.runtime.parallel.group import free_port as pick

    return pick()


def start_server(dp_size: int, policy: str, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
           "--dp-size", str(dp_size), "--router-policy", policy, "--log-level", "warning",
           "--max-total-tokens", str(args.max_total_tokens), "--context-length", "2048"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    path = "/readiness" if dp_size > 1 else "/health"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if requests.get(url + path, timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench_dp(args, tok) -> dict:
    results: dict = {}
    for name, (dp_size, policy) in SERVERS.items():
        proc, url = start_server(dp_size, policy, args)
        try:
            for wl_cls in (FewShot, MultiTurnChat):
                workload = wl_cls(tok, random.Random(0), args.quick)
                engine = HttpEngine(url, tok)
                t = time.perf_counter()
                workload.run(engine)  # the workloads only call .generate(prompts, params)
                wall = time.perf_counter() - t
                meta = [r["meta_info"] for r in engine.results]
                prompt = sum(m["prompt_tokens"] for m in meta)
                out = sum(m["completion_tokens"] for m in meta)
                cached = sum(m["cached_tokens"] for m in meta)
                results.setdefault(workload.name, {})[name] = {
                    "requests": len(meta), "prompt_tokens": prompt, "cached_tokens": cached,
                    "hit_rate": cached / prompt, "wall_s": wall, "output_tok_s": out / wall,
                    "req_s": len(meta) / wall}
        finally:
            stop_server(proc)
    return results


def bench_tp(args) -> dict:
    from radixlm.runtime.engine import Engine

    engines = {tp: Engine(dtype="float32", tp_size=tp, max_total_tokens=8192,
                          context_length=1024, log_level="warning") for tp in (1, 2)}
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(["river", "stone", "light", "music", "city", "winter"])
                        for _ in range(40)) for _ in range(args.tp_batch)]
    params = {"temperature": 0, "max_new_tokens": args.tp_tokens, "ignore_eos": True}
    times: dict[int, list[float]] = {1: [], 2: []}
    outputs: dict[int, list] = {}
    try:
        for _ in range(args.tp_rounds):
            for tp, engine in engines.items():
                engine.flush_cache()
                steps = engine.get_stats()["num_steps_total"]
                t = time.perf_counter()
                outs = engine.generate(prompts, params)
                wall = time.perf_counter() - t
                times[tp].append(1000 * wall / (engine.get_stats()["num_steps_total"] - steps))
                outputs[tp] = [o["output_ids"] for o in outs]
    finally:
        for engine in engines.values():
            engine.shutdown()
    res: dict = {f"tp{tp}": {"step_ms_median": statistics.median(v), "step_ms_rounds": v}
                 for tp, v in times.items()}
    res.update(batch=args.tp_batch, new_tokens=args.tp_tokens,
               outputs_identical=outputs[1] == outputs[2])
    return res


def targets(dp: dict) -> dict:
    few, multi = dp.get("few_shot", {}), dp.get("multi_turn_chat", {})
    out = {}
    if few:
        gap = few["single"]["hit_rate"] - few["dp2_cache_aware"]["hit_rate"]
        out["few_shot_cache_aware_within_5_points_of_single"] = {"gap": gap, "met": gap <= 0.05}
    if multi:
        rr = multi["dp2_round_robin"]["hit_rate"]
        ratio = multi["dp2_cache_aware"]["hit_rate"] / rr if rr else float("inf")
        out["multi_turn_cache_aware_vs_round_robin"] = {"ratio": ratio, "met": ratio >= 1.3}
    return out


def print_table(res: dict, flush: bool = False) -> None:
    print(f"host: {res['host']['cpu']} ({res['host']['cores']} cores) "
          f"isa: {' '.join(res['host']['isa'])}")
    for wl, by_server in res.get("dp", {}).items():
        print(f"\n{wl:<18}{'hit_rate':>10}{'out tok/s':>12}{'req/s':>9}{'wall s':>9}")
        for name, r in by_server.items():
            print(f"  {name:<16}{r['hit_rate']:>10.3f}{r['output_tok_s']:>12.1f}"
                  f"{r['req_s']:>9.2f}{r['wall_s']:>9.1f}")
    for name, t in res.get("targets", {}).items():
        print(f"target {name}: {t}")
    tp = res.get("tp")
    if tp:
        print(f"\ntp step time (fp32, batch {tp['batch']}, median of rounds): "
              f"tp1 {tp['tp1']['step_ms_median']:.1f} ms, "
              f"tp2 {tp['tp2']['step_ms_median']:.1f} ms; "
              f"outputs identical: {tp['outputs_identical']}")
    if flush:
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small workloads")
    ap.add_argument("--skip-dp", action="store_true")
    ap.add_argument("--skip-tp", action="store_true")
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--tp-rounds", type=int, default=3)
    ap.add_argument("--tp-batch", type=int, default=8)
    ap.add_argument("--tp-tokens", type=int, default=32)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    from radixlm.runtime.weights import load_tokenizer, resolve_model

    res: dict = {"host": host_info(), "quick": args.quick}
    if not args.skip_dp:
        res["dp"] = bench_dp(args, load_tokenizer(resolve_model("smollm2-135m-instruct")))
        res["targets"] = targets(res["dp"])
        print_table(res, flush=True)  # in case the tp part fails
    if not args.skip_tp:
        res["tp"] = bench_tp(args)
    print(json.dumps(res, indent=1))
    print_table(res)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
