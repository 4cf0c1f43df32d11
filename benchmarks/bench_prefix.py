"""Prefix-sharing workloads (after the SGLang paper), radix cache on vs off in one run.

    .venv/bin/python benchmarks/bench_prefix.py [--quick] [--out results.json]

Two engines (same model, default dtype, same pool size), one with the radix cache and one
with ``disable_radix_cache=True``, run the same prompts, greedy, one workload at a time
(cache flushed before each run):

* ``few_shot``: a 5-shot prefix of ~1k tokens shared by 64 questions, submitted as one
  batch, 8 output tokens each.
* ``multi_turn_chat``: 16 conversations x 4 turns through the chat template; each
  conversation is a thread and sends turn k+1 (history + answer + new user message) only
  after turn k's answer arrived; conversations run concurrently.
* ``tree_of_thought``: one question, 3 levels of 3 branches (3 + 9 + 27 nodes); each node
  generates 16 tokens and its children extend the parent's prompt + output; a level is
  submitted as a batch when the previous one is done.
* ``no_sharing``: 64 unrelated prompts (distinct first tokens), 32 output tokens each:
  what the cache costs when there is nothing to share (run 3 times per mode, alternating,
  median kept, in full mode).

Metrics per workload and mode: ``output_tok_s`` and ``req_s`` (completion tokens and
requests over the workload's wall time), ``ttft_p50_s`` / ``ttft_p99_s`` (from
``meta_info["ttft"]``), ``hit_rate`` (sum of ``meta_info["cached_tokens"]`` / sum of
``meta_info["prompt_tokens"]``), ``prefill_tokens`` (tokens the engine actually computed)
and ``optimal_hit_rate``, defined as follows.

Optimal hit rate. Requests are numbered in the order the workload submits them (within a
batch, list order); a request's output is *known* to a later request if it finished
before that request was submitted (an event counter orders submissions and completions).
For request i with prompt p_i, let h_j = p_j + o_j[:-1] for each earlier request j whose
output o_j is known (the last sampled token is never fed back, so it has no K/V), and
h_j = p_j otherwise. Then

    optimal_i = min(len(p_i) - 1, max_{j < i} lcp(p_i, h_j))

(``lcp``: length of the longest common prefix; at least one prompt token must be computed
to produce logits), and ``optimal_hit_rate = sum_i optimal_i / sum_i len(p_i)``. It is what
an unbounded cache that shares every computed prefix, including with requests still in
flight, would reach. ``hit_rate_vs_optimal`` = hit_rate / optimal_hit_rate.

Cache tiers (``agent_tiers`` and ``restart``, each with engines of its own):

* ``agent_tiers``: agents reusing prompt templates whose working set is 4x the KV pool
  (16 templates of ~1k tokens over a 4k-token pool, in full mode), each visit a template
  plus a new task, visited round by round in a shuffled order by two concurrent agents, on
  three engines: the pool alone (``pool``), the pool with a host tier of 4x its size
  (``pool+host``: ``enable_hierarchical_cache``, ``hicache_ratio=4``) and a pool large
  enough for everything (``unlimited``). Reported: hit rate by tier, TTFT, throughput.
* ``restart``: a 3k-token prompt on an engine with a disk tier (TTFT cold), the engine shut
  down, a new engine over the same directory serving the same prompt (TTFT after the
  restart, its K/V from disk), alternating cold prompts and restarts round by round;
  also with the block files dropped from the page cache (``posix_fadvise DONTNEED``).

Targets reported: few-shot throughput (cache on) >= 4x cache off; hit rate >= 90% of
optimal on every sharing workload; overhead on ``no_sharing`` (1 - on/off output tok/s)
<= 3%; ``agent_tiers``: hit rate with the host tier >= 80% of the unlimited pool's;
``restart``: TTFT after a restart <= 15% of the cold TTFT. Timings on a shared or loaded
machine are noisy, the no-sharing overhead most of all; ``cpu_s`` (CPU seconds of this
process, all threads) and ``cpu_speedup`` (CPU seconds per output token, off / on) are
reported beside wall-clock numbers because they depend less on other processes.
``outputs_identical`` counts (prompt, output) pairs found in both modes (greedy: all of
them, unless low-precision numerics flip a near-tie).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

WORDS = ("the of and to in is was for on that with as by at from his her an were are which "
         "this be or had not but what all when there can who been one more time city river "
         "water music history science garden market winter summer story people world light "
         "stone bridge forest island letter window mountain village train paper school").split()
MODES = ("radix_on", "radix_off")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# --------------------------------------------------------------------------- recording
@dataclass
class Record:
    prompt: list[int]
    submit_seq: int
    done_seq: int = -1
    result: dict = field(default_factory=dict)


class Recorder:
    """Runs requests on an engine and logs submission/completion order for the optimum."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.records: list[Record] = []
        self._seq = 0
        self._lock = threading.Lock()

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def generate(self, prompts: list[list[int]], params: dict) -> list[dict]:
        with self._lock:
            recs = [Record(p, self._next()) for p in prompts]
            self.records.extend(recs)
        results = self.engine.generate(input_ids=prompts, sampling_params=params)
        with self._lock:
            for rec, res in zip(recs, results):
                rec.done_seq, rec.result = self._next(), res
        return results

    def optimal_cached(self) -> list[int]:
        """``optimal_i`` of the module docstring, for every request in submission order."""
        recs = sorted(self.records, key=lambda r: r.submit_seq)
        best = []
        for i, rec in enumerate(recs):
            m = 0
            for prev in recs[:i]:
                hist = prev.prompt
                if prev.done_seq < rec.submit_seq:
                    hist = prev.prompt + prev.result["output_ids"][:-1]
                m = max(m, lcp(rec.prompt, hist))
            best.append(min(len(rec.prompt) - 1, m))
        return best


def summarize(rec: Recorder, wall: float, stats_before: dict, stats_after: dict) -> dict:
    res = [r.result for r in rec.records]
    meta = [r["meta_info"] for r in res]
    prompt = sum(m["prompt_tokens"] for m in meta)
    cached = sum(m["cached_tokens"] for m in meta)
    out = sum(m["completion_tokens"] for m in meta)
    ttfts = [m["ttft"] for m in meta if "ttft" in m]
    optimal = sum(rec.optimal_cached())
    return {
        "requests": len(res), "prompt_tokens": prompt, "output_tokens": out,
        "wall_s": wall, "output_tok_s": out / wall, "req_s": len(res) / wall,
        "ttft_p50_s": pct(ttfts, 0.5), "ttft_p99_s": pct(ttfts, 0.99),
        "cached_tokens": cached, "hit_rate": cached / prompt,
        "optimal_cached_tokens": optimal, "optimal_hit_rate": optimal / prompt,
        "hit_rate_vs_optimal": (cached / optimal) if optimal else None,
        "prefill_tokens": stats_after["prefill_tokens_total"]
        - stats_before["prefill_tokens_total"],
        "retractions": stats_after["num_retractions_total"]
        - stats_before["num_retractions_total"],
    }


# --------------------------------------------------------------------------- workloads
class FewShot:
    name = "few_shot"

    def __init__(self, tok, rng: random.Random, quick: bool) -> None:
        shots = []
        for _ in range(5):
            passage = words(rng, 40 if quick else 150)
            shots.append(f"Passage: {passage}\nQuestion: Which word of the passage names a "
                         f"place?\nAnswer: {rng.choice(WORDS)}\n\n")
        prefix = tok.encode("Read each passage and answer the question with one word.\n\n"
                            + "".join(shots), add_special_tokens=False)
        n = 8 if quick else 64
        self.prompts = [prefix + tok.encode(
            f"Passage: {words(rng, rng.randint(20, 40))}\nQuestion: Which word of the passage "
            f"names a place?\nAnswer:", add_special_tokens=False) for _ in range(n)]
        self.prefix_len = len(prefix)
        self.params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}

    def run(self, rec: Recorder) -> None:
        rec.generate(self.prompts, self.params)


class MultiTurnChat:
    name = "multi_turn_chat"

    def __init__(self, tok, rng: random.Random, quick: bool) -> None:
        self.tok = tok
        n_conv, self.turns = (4, 2) if quick else (16, 4)
        self.users = [[f"{words(rng, rng.randint(30, 60))}. Summarise this in one sentence."
                       for _ in range(self.turns)] for _ in range(n_conv)]
        self.params = {"temperature": 0, "max_new_tokens": 32}

    def _ids(self, messages: list[dict]) -> list[int]:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True,
                                            tokenize=False)
        return self.tok.encode(text, add_special_tokens=False)

    def _conversation(self, rec: Recorder, users: list[str]) -> None:
        messages: list[dict] = []
        for msg in users:
            messages.append({"role": "user", "content": msg})
            out = rec.generate([self._ids(messages)], self.params)[0]
            messages.append({"role": "assistant", "content": out["text"]})

    def run(self, rec: Recorder) -> None:
        with ThreadPoolExecutor(len(self.users)) as pool:
            for f in [pool.submit(self._conversation, rec, u) for u in self.users]:
                f.result()


class TreeOfThought:
    name = "tree_of_thought"

    def __init__(self, tok, rng: random.Random, quick: bool) -> None:
        self.tok = tok
        self.depth, self.branch = (2, 2) if quick else (3, 3)
        question = (f"Problem: {words(rng, 120 if quick else 300)}\n"
                    "Think about the problem step by step, trying different approaches.\n")
        self.root = tok.encode(question, add_special_tokens=False)
        self.params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}

    def run(self, rec: Recorder) -> None:
        frontier = [self.root]
        for level in range(self.depth):
            prompts = [p + self.tok.encode(f"\nLevel {level + 1}, idea {b + 1}:",
                                           add_special_tokens=False)
                       for p in frontier for b in range(self.branch)]
            outs = rec.generate(prompts, self.params)
            frontier = [p + o["output_ids"] for p, o in zip(prompts, outs)]


class NoSharing:
    name = "no_sharing"

    def __init__(self, tok, rng: random.Random, quick: bool) -> None:
        n = 8 if quick else 64
        firsts = rng.sample(range(1000, 40000), n)  # distinct first tokens: nothing shared
        self.prompts = [[first] + tok.encode(words(rng, rng.randint(100, 200)),
                                             add_special_tokens=False)
                        for first in firsts]
        self.params = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}

    def run(self, rec: Recorder) -> None:
        rec.generate(self.prompts, self.params)


# --------------------------------------------------------------------------- cache tiers
TIER_MODES = ("pool", "pool+host", "unlimited")


class AgentTiers:
    """Templates whose working set is 4x the pool, revisited round by round (see the module
    docstring); ``pool_tokens`` is the small pool."""

    name = "agent_tiers"

    def __init__(self, tok, rng: random.Random, quick: bool) -> None:
        self.pool_tokens = 1024 if quick else 4096
        count, length = (8, 512) if quick else (16, 1024)
        self.templates = []
        for t in range(count):
            ids = tok.encode(f"You are agent {t}. Rules: ", add_special_tokens=False)
            while len(ids) < length:
                ids += tok.encode(" " + words(rng, 64), add_special_tokens=False)
            self.templates.append(ids[:length])
        self.rounds = 3 if quick else 4
        self.visits = []
        for r in range(self.rounds):
            order = list(range(count))
            rng.shuffle(order)
            self.visits += [self.templates[t] + tok.encode(
                f"\nTask {r}.{t}: {words(rng, rng.randint(10, 30))}\nAnswer:",
                add_special_tokens=False) for t in order]
        self.working_set = count * length
        self.params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}

    def run(self, rec: Recorder) -> None:
        lock, queue = threading.Lock(), list(self.visits)

        def agent() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    prompt = queue.pop(0)
                rec.generate([prompt], self.params)

        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(agent) for _ in range(2)]:
                f.result()


def tier_split(rec: Recorder) -> dict:
    split: Counter = Counter()
    for r in rec.records:
        split.update(r.result["meta_info"].get("cached_tokens_details") or {})
    return dict(split)


def bench_agent_tiers(args, tok, repeats: int) -> dict:
    """The three engines of ``agent_tiers`` on one workload, runs alternating."""
    from radixlm.runtime.engine import Engine

    workload = AgentTiers(tok, random.Random(f"{args.seed}-agent_tiers"), args.quick)
    pool = workload.pool_tokens
    common = {"dtype": args.dtype, "log_level": "warning"}
    engines = {"pool": Engine(args.model, max_total_tokens=pool, **common),
               "pool+host": Engine(args.model, max_total_tokens=pool, hicache_ratio=4,
                                   enable_hierarchical_cache=True, **common),
               "unlimited": Engine(args.model, max_total_tokens=8 * pool, **common)}
    runs: dict[str, list[dict]] = {m: [] for m in TIER_MODES}
    try:
        for i in range(repeats):
            for mode in TIER_MODES if i % 2 == 0 else TIER_MODES[::-1]:
                engine = engines[mode]
                if not engine.flush_cache():
                    raise RuntimeError("flush_cache refused")
                rec = Recorder(engine)
                before = engine.get_stats()
                t = time.perf_counter()
                workload.run(rec)
                summary = summarize(rec, time.perf_counter() - t, before, engine.get_stats())
                engine.check_integrity()
                summary["cached_by_tier"] = tier_split(rec)
                runs[mode].append(summary)
    finally:
        for engine in engines.values():
            engine.shutdown()
    result: dict = {"pool_tokens": pool, "working_set_tokens": workload.working_set,
                    "host_tier_tokens": 4 * pool}
    for mode in TIER_MODES:
        by_wall = sorted(runs[mode], key=lambda s: s["wall_s"])
        result[mode] = {**by_wall[len(by_wall) // 2], "repeats": repeats,
                        "hit_rate_all": [s["hit_rate"] for s in runs[mode]]}
    result["host_vs_unlimited_hit_rate"] = (result["pool+host"]["hit_rate"]
                                            / result["unlimited"]["hit_rate"])
    return result


def _drop_page_cache(directory: str) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bench_restart(args, tok, repeats: int) -> dict:
    """Cold TTFT of a 3k-token prompt vs its TTFT on a restarted engine (disk tier)."""
    from radixlm.runtime.engine import Engine

    rng = random.Random(f"{args.seed}-restart")
    length = 1024 if args.quick else 3072
    params = {"temperature": 0, "max_new_tokens": 1}
    rows = []
    with tempfile.TemporaryDirectory(prefix="radixlm-restart-") as store:
        def engine():
            e = Engine(args.model, dtype=args.dtype, max_total_tokens=2 * length + 512,
                       enable_hierarchical_cache=True, hicache_storage_backend="file",
                       hicache_storage_dir=store, log_level="warning")
            e.generate("Warm up the steps, please.", {"max_new_tokens": 4})
            return e

        for r in range(repeats):
            ids = []
            while len(ids) < length:
                ids += tok.encode(" " + words(rng, 64), add_special_tokens=False)
            ids = tok.encode(f"Document {r}:", add_special_tokens=False) + ids[:length]
            first = engine()
            cold = first.generate(input_ids=ids, sampling_params=params)["meta_info"]
            first.shutdown()  # writes what is queued
            row = {"prompt_tokens": len(ids), "cold_ttft_s": cold["ttft"]}
            for drop in (False, True):
                if drop:
                    _drop_page_cache(store)
                again = engine()
                meta = again.generate(input_ids=ids, sampling_params=params)["meta_info"]
                again.shutdown()
                key = "restart_cold_disk" if drop else "restart"
                row[f"{key}_ttft_s"] = meta["ttft"]
                row[f"{key}_from_disk"] = meta["cached_tokens_details"]["storage"]
                row[f"{key}_ratio"] = meta["ttft"] / cold["ttft"]
            rows.append(row)
    med = {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0]}
    return {"rounds": rows, "median": med}


# --------------------------------------------------------------------------- driver
def run_once(engine, workload) -> tuple[dict, list[list[int]]]:
    if not engine.flush_cache():
        raise RuntimeError("flush_cache refused: requests still running")
    rec = Recorder(engine)
    before = engine.get_stats()
    t, c = time.perf_counter(), time.process_time()
    workload.run(rec)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    after = engine.get_stats()
    engine.check_integrity()
    summary = summarize(rec, wall, before, after)
    summary["cpu_s"] = cpu
    # keyed by prompt: concurrent conversations are submitted in a timing-dependent order
    outputs = Counter((tuple(r.prompt), tuple(r.result["output_ids"])) for r in rec.records)
    return summary, outputs


def bench_workload(engines: dict, workload, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    outputs: dict[str, Counter] = {}
    for i in range(repeats):
        order = MODES if i % 2 == 0 else MODES[::-1]
        for mode in order:
            summary, outs = run_once(engines[mode], workload)
            runs[mode].append(summary)
            outputs[mode] = outs
    result = {}
    for mode in MODES:
        by_wall = sorted(runs[mode], key=lambda s: s["wall_s"])
        result[mode] = {**by_wall[len(by_wall) // 2], "repeats": repeats}
        if repeats > 1:
            result[mode]["wall_s_all"] = [s["wall_s"] for s in runs[mode]]
    on, off = outputs["radix_on"], outputs["radix_off"]
    same = sum((on & off).values())
    result["outputs_identical"] = f"{same}/{max(sum(on.values()), sum(off.values()))}"
    result["speedup"] = result["radix_on"]["output_tok_s"] / result["radix_off"]["output_tok_s"]
    # CPU seconds of this process per output token: less sensitive to other processes
    result["cpu_speedup"] = ((result["radix_off"]["cpu_s"] / result["radix_off"]["output_tokens"])
                             / (result["radix_on"]["cpu_s"] / result["radix_on"]["output_tokens"]))
    return result


def targets(results: dict) -> dict:
    t = {}
    if "few_shot" in results:
        s = results["few_shot"]["speedup"]
        t["few_shot_speedup>=4x"] = {"value": s, "met": s >= 4.0}
    for name in ("few_shot", "multi_turn_chat", "tree_of_thought"):
        if name in results:
            v = results[name]["radix_on"]["hit_rate_vs_optimal"]
            t[f"{name}_hit_rate>=90%_of_optimal"] = {"value": v, "met": v is not None
                                                     and v >= 0.9}
    if "agent_tiers" in results:
        v = results["agent_tiers"]["host_vs_unlimited_hit_rate"]
        t["agent_tiers_host_hit_rate>=80%_of_unlimited"] = {"value": v, "met": v >= 0.8}
    if "restart" in results:
        v = results["restart"]["median"]["restart_ratio"]
        t["restart_ttft<=15%_of_cold"] = {"value": v, "met": v <= 0.15}
        v = results["restart"]["median"]["restart_cold_disk_ratio"]
        t["restart_ttft_page_cache_dropped<=15%_of_cold"] = {"value": v, "met": v <= 0.15}
    if "no_sharing" in results:
        overhead = 1 - results["no_sharing"]["speedup"]
        t["no_sharing_overhead<=3%"] = {"value": overhead, "met": overhead <= 0.03}
        cpu_overhead = 1 - results["no_sharing"]["cpu_speedup"]
        t["no_sharing_cpu_overhead<=3%"] = {"value": cpu_overhead, "met": cpu_overhead <= 0.03}
    return t


def print_table(results: dict) -> None:
    cols = ("output_tok_s", "req_s", "ttft_p50_s", "ttft_p99_s", "hit_rate",
            "optimal_hit_rate", "prefill_tokens", "wall_s")
    print(f"\n{'workload':<17}{'mode':<10}" + "".join(f"{c:>17}" for c in cols))
    for name, res in results["workloads"].items():
        if name in TIER_WORKLOADS:
            continue
        for mode in MODES:
            row = res[mode]
            cells = "".join(f"{row[c]:>17.4f}" if isinstance(row[c], float) else f"{row[c]:>17}"
                            for c in cols)
            print(f"{name:<17}{mode:<10}{cells}")
        print(f"{'':<17}{'speedup':<10}{res['speedup']:>17.2f}   (cpu-time speedup "
              f"{res['cpu_speedup']:.2f}, outputs identical {res['outputs_identical']})")
    print_tiers(results["workloads"])
    print("\ntargets:")
    for k, v in results["targets"].items():
        val = "n/a" if v["value"] is None else f"{v['value']:.3f}"
        print(f"  {k:<42}{val:>10}  {'met' if v['met'] else 'NOT MET'}")


def print_tiers(workloads: dict) -> None:
    res = workloads.get("agent_tiers")
    if res:
        print(f"\nagent_tiers: pool {res['pool_tokens']} tokens, working set "
              f"{res['working_set_tokens']}, host tier {res['host_tier_tokens']}")
        print(f"{'mode':<12}{'hit_rate':>10}{'ttft_p50_s':>12}{'output_tok_s':>14}"
              f"{'wall_s':>9}  cached by tier")
        for mode in TIER_MODES:
            row = res[mode]
            print(f"{mode:<12}{row['hit_rate']:>10.3f}{row['ttft_p50_s']:>12.4f}"
                  f"{row['output_tok_s']:>14.2f}{row['wall_s']:>9.1f}  "
                  f"{row['cached_by_tier'] or '-'}")
    res = workloads.get("restart")
    if res:
        print(f"\nrestart ({res['median']['prompt_tokens']} tokens): cold TTFT / after a "
              "restart / after a restart with the page cache dropped, per round")
        for row in res["rounds"]:
            print(f"  {row['cold_ttft_s']:.3f} s / {row['restart_ttft_s']:.3f} s "
                  f"({row['restart_ratio']:.1%}, {row['restart_from_disk']} from disk) / "
                  f"{row['restart_cold_disk_ttft_s']:.3f} s ({row['restart_cold_disk_ratio']:.1%})")


TIER_WORKLOADS = ("agent_tiers", "restart")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="auto", help="engine dtype (auto: bf16 where native)")
    ap.add_argument("--max-total-tokens", type=int, default=32768, help="KV pool, both engines")
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    ap.add_argument("--workloads", default="few_shot,multi_turn_chat,tree_of_thought,no_sharing,"
                                           "agent_tiers,restart")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs per mode, alternating (default 1; no_sharing: 3, quick: 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    host = host_info()
    print(host_line(host), flush=True)
    kinds = {w.name: w for w in (FewShot, MultiTurnChat, TreeOfThought, NoSharing)}
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in kinds and n not in TIER_WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from "
                 f"{sorted(kinds) + list(TIER_WORKLOADS)}")
    common = {"dtype": args.dtype, "max_total_tokens": args.max_total_tokens,
              "log_level": "warning"}
    engines = {"radix_on": Engine(args.model, **common),
               "radix_off": Engine(args.model, disable_radix_cache=True, **common)}
    try:
        tok = engines["radix_on"].tokenizer
        for engine in engines.values():  # warm-up
            engine.generate("Hello there, how are you?", {"temperature": 0,
                                                          "max_new_tokens": 4})
        runner = engines["radix_on"].runner
        results = {"host": host, "config": {"model": args.model, "quick": args.quick,
                              "dtype": str(runner.dtype), "device": str(runner.device),
                              "attention_backend": runner.attention_backend_name,
                              "max_total_tokens": args.max_total_tokens, "seed": args.seed},
                   "workloads": {}}
        for name in names:
            if name in TIER_WORKLOADS:
                continue
            workload = kinds[name](tok, random.Random(f"{args.seed}-{name}"), args.quick)
            repeats = args.repeats or (3 if name == "no_sharing" and not args.quick else 1)
            t = time.perf_counter()
            results["workloads"][name] = bench_workload(engines, workload, repeats)
            print(f"[{name}: {time.perf_counter() - t:.1f}s]", flush=True)
    finally:
        for engine in engines.values():
            engine.shutdown()
    for name, bench in (("agent_tiers", bench_agent_tiers), ("restart", bench_restart)):
        if name in names:
            t = time.perf_counter()
            results["workloads"][name] = bench(args, tok, args.repeats or (1 if args.quick
                                                                            else 3))
            print(f"[{name}: {time.perf_counter() - t:.1f}s]", flush=True)
    results["targets"] = targets(results["workloads"])
    print(json.dumps(results, indent=2))
    print(host_line(host))
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
