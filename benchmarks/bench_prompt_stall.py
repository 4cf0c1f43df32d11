"""How long a long prompt arriving holds the streams already decoding, and what it costs.

    .venv/bin/python benchmarks/bench_prompt_stall.py [--model M] [--prompt-tokens 4000]
        [--streams 1] [--sizes 256,100000] [--rounds 2] [--out r.json]

One engine per ``mixed_prefill_size`` in ``--sizes`` (while requests decode, a prompt that
needs chunking comes this many tokens a step, the running requests decoding in each; a
size at or over ``chunked_prefill_size``, 1024 by default, gives it a whole chunk a step),
greedy, speculation off. A round, per engine (engines alternate): ``--streams`` streams
start decoding (64-token prompts, 400 new tokens each); once each has its first token, a
``--prompt-tokens`` prompt (random ids, no prefix shared) arrives for one token. Reported
per size: the streams' longest gap between two tokens while the prompt was prefilled
(``stall_s``), their median gap then and before it came (``gap_p50_s``,
``idle_gap_p50_s``), and the prompt's TTFT. Medians over ``--rounds``. Prints the host
line, a table and the JSON.
"""

from __future__ import annotations

# radixlm before torch: it bounds OpenMP's spin-wait before torch loads libgomp
import radixlm  # noqa: F401  # isort: skip

import argparse
import json
import random
import statistics
import threading
import time

STREAM_NEW = 400


def one_round(engine, streams: int, prompt: list[int], rng: random.Random) -> dict:
    """The streams, then the prompt once they all decode; gaps from the streams' token times."""
    assert engine.flush_cache()
    stamps: list[list[float]] = [[] for _ in range(streams)]
    started = threading.Barrier(streams + 1)
    params = {"max_new_tokens": STREAM_NEW, "temperature": 0, "ignore_eos": True}

    def stream(i: int) -> None:
        ids = [rng.randrange(1000, 30000) for _ in range(64)]
        for n, _ in enumerate(engine.generate(input_ids=ids, sampling_params=params,
                                              stream=True)):
            stamps[i].append(time.perf_counter())
            if n == 0:
                started.wait()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.2)  # a few tokens of steady decoding first
    t0 = time.perf_counter()
    engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1})
    t1 = time.perf_counter()
    for t in threads:
        t.join()
    during, before = [], []
    for ts in stamps:
        for a, b in zip(ts, ts[1:]):
            if b > t0 and a < t1:
                during.append(b - a)
            elif b <= t0:
                before.append(b - a)
    return {"stall_s": max(during, default=0.0), "gap_p50_s": statistics.median(during or [0]),
            "idle_gap_p50_s": statistics.median(before or [0]), "prompt_ttft_s": t1 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--sizes", default="256,100000", help="mixed_prefill_size values")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    host = host_info()
    print(host_line(host), flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    ctx = args.prompt_tokens + STREAM_NEW + 128
    engines = {s: Engine(args.model, log_level="warning", speculative_algorithm=None,
                         mixed_prefill_size=s, context_length=ctx) for s in sizes}
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)]
    runs: dict[int, list[dict]] = {s: [] for s in sizes}
    try:
        for e in engines.values():  # warm-up
            e.generate(input_ids=prompt[:64], sampling_params={"max_new_tokens": 8})
        for r in range(args.rounds):
            for s in (sizes if r % 2 == 0 else sizes[::-1]):
                runs[s].append(one_round(engines[s], args.streams, prompt, rng))
    finally:
        for e in engines.values():
            e.shutdown()
    results = {"host": host, "model": args.model or "default", "prompt_tokens":
               args.prompt_tokens, "streams": args.streams, "rounds": args.rounds,
               "by_size": {s: {k: round(statistics.median(r[k] for r in rs), 3)
                               for k in rs[0]} | {"all": rs} for s, rs in runs.items()}}
    print("| mixed_prefill_size | stall s | gap p50 s | gap p50 before s | prompt TTFT s |")
    print("|---|---|---|---|---|")
    for s, m in results["by_size"].items():
        print(f"| {s} | {m['stall_s']} | {m['gap_p50_s']} | {m['idle_gap_p50_s']} | "
              f"{m['prompt_ttft_s']} |")
    print(json.dumps(results, indent=2))
    print(host_line(host))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
