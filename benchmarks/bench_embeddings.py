"""Embedding throughput: 64 short inputs embedded vs 64 one-token generations.

    .venv/bin/python benchmarks/bench_embeddings.py [--rounds 5] [--model M] [--out r.json]

One engine (the embedded model unless ``--model``, default settings) runs the same 64 short
sentences (8-16 tokens, no two sharing a first word, so the radix cache has nothing to
share; it is flushed before every run) two ways, each submitted as one batch:

* ``encode``: ``Engine.encode(texts)``: prefill only, the mean of the final-normed hidden
  states per input; no LM head, no sampling;
* ``generate_1``: ``Engine.generate(texts, {"max_new_tokens": 1})``: the same prefill, then
  the head at each input's last position and one sampled token;
* ``prefill_0`` (for scale): ``max_new_tokens`` 0, the prefill alone (no head, no pooling):
  the floor both stand on.

Rounds alternate the order (the first of each is a warm-up, not counted); the median wall
time per mode is kept. Reported: inputs/s and prompt tokens/s per mode, and ``speedup`` =
encode inputs/s / generate_1 inputs/s (the issue's target: >= 5x). Prints the host line
(CPU model, cores, ISA flags), a table and the JSON.
"""

from __future__ import annotations

# radixlm before torch: it bounds OpenMP's spin-wait before torch loads libgomp
import radixlm  # noqa: F401  # isort: skip

import argparse
import json
import statistics
import time

SUBJECTS = ["The cat", "A river", "Our team", "This recipe", "My neighbour", "The old bridge",
            "Every winter", "Their new app", "A small bakery", "The museum", "Rain",
            "The orchestra", "Her bicycle", "Most engineers", "The village", "A good book"]
ENDINGS = ["sat quietly in the warm afternoon sun.", "changed everything we knew about it.",
           "was closed for repairs until next spring.", "surprised the visitors from abroad."]
TARGET = 5.0
MODES = ("encode", "generate_1", "prefill_0")


def make_inputs(n: int = 64) -> list[str]:
    """``n`` short sentences, distinct, no two with the same first word (subject x ending,
    a number in front keeps the first tokens apart)."""
    out = []
    for i in range(n):
        subject, ending = SUBJECTS[i % len(SUBJECTS)], ENDINGS[(i // len(SUBJECTS)) % 4]
        out.append(f"{i + 1}. {subject} {ending}")
    return out


def timed(engine, mode: str, texts: list[str]) -> float:
    assert engine.flush_cache()
    t0 = time.perf_counter()
    if mode == "encode":
        outs = engine.encode(texts)
        assert all(o["embedding"] is not None for o in outs)
    else:
        new = 1 if mode == "generate_1" else 0
        outs = engine.generate(texts, {"max_new_tokens": new, "ignore_eos": True})
        assert all(o["meta_info"]["completion_tokens"] == new for o in outs)
    return time.perf_counter() - t0


def run(engine, texts: list[str], rounds: int) -> dict:
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(rounds + 1):
        for mode in (MODES if r % 2 else MODES[::-1]):
            t = timed(engine, mode, texts)
            if r:  # round 0 warms up
                times[mode].append(t)
    tokens = sum(len(engine.tokenizer.encode(t, add_special_tokens=False)) for t in texts)
    results: dict = {"inputs": len(texts), "prompt_tokens": tokens, "rounds": rounds}
    for mode, ts in times.items():
        wall = statistics.median(ts)
        results[mode] = {"wall_s": round(wall, 4), "inputs_s": round(len(texts) / wall, 1),
                         "prompt_tok_s": round(tokens / wall, 1),
                         "wall_s_all": [round(t, 4) for t in ts]}
    speedup = results["encode"]["inputs_s"] / results["generate_1"]["inputs_s"]
    results["speedup"] = round(speedup, 2)
    results["target"] = TARGET
    results["meets_target"] = speedup >= TARGET
    return results


def table(results: dict) -> str:
    rows = ["| mode | wall s (median) | inputs/s | prompt tok/s |", "|---|---|---|---|"]
    for mode in MODES:
        r = results[mode]
        rows.append(f"| {mode} | {r['wall_s']} | {r['inputs_s']} | {r['prompt_tok_s']} |")
    rows.append(f"| speedup (encode / generate_1) | | {results['speedup']}x "
                f"(target {TARGET}x) | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    host = host_info()
    print(host_line(host), flush=True)
    with Engine(args.model, log_level="warning") as engine:
        results = {"host": host, "model": engine.model_name,
                   **run(engine, make_inputs(), args.rounds)}
    print(table(results))
    print(json.dumps(results, indent=2))
    print(host_line(host))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
