"""radixlm vs llama.cpp (llama-cpp-python) on the same GGUF, same token ids, alternating
rounds: single-stream decode tok/s, prefill tok/s and TTFT; per-round ratios and medians.

    make bench-llamacpp        # builds llama-cpp-python into .venv-llamacpp once (~10 min)
    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--rounds 3] [--llama-python PY]

llama.cpp runs in a worker process under its own interpreter (``--llama-python``, default
``.venv-llamacpp/bin/python``, else this one): the two never share a process or a venv, and
the parent alternates them round by round so the VM's slow phases hit both alike. Both use
every core of the host (llama.cpp ``n_threads`` = cores, torch's default). Prints the host
first; JSON then a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the of and to in is was for on that with as by at from his her an were are which "
         "this be or had not but what all when there can who been one more time city river "
         "water music history science garden market winter summer story people world").split()


# ---------------------------------------------------------------- llama.cpp worker
def worker(gguf: str, threads: int, extra_bufts: bool) -> None:
    """Reads one JSON job a line ({"prompt": ids, "new": n}), answers timings a line.
    ``extra_bufts`` False: plain weight buffers (``llamacpp_common.use_plain_buffers``)."""
    import llama_cpp
    from llamacpp_common import announce_ready, use_plain_buffers

    if not extra_bufts:
        use_plain_buffers(llama_cpp)
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=4096, n_threads=threads,
                          n_threads_batch=threads, n_batch=512, verbose=False)
    announce_ready(llama_cpp)
    for line in sys.stdin:
        job = json.loads(line)
        llm.reset()
        t0 = time.perf_counter()
        first = None
        n = 0
        for _ in llm.generate(job["prompt"], top_k=1, top_p=1.0, temp=0.0, reset=True):
            n += 1
            if first is None:
                first = time.perf_counter() - t0
            if n >= job["new"]:
                break
        total = time.perf_counter() - t0
        print(json.dumps({"ttft": first, "total": total, "tokens": n}), flush=True)


class LlamaCpp:
    def __init__(self, python: str, gguf: str, threads: int, extra_bufts: bool) -> None:
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", gguf, "--threads", str(threads)]
            + (["--llama-extra-bufts"] if extra_bufts else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.version, self.features = ready["ready"], ready.get("features", "")

    def run(self, prompt: list[int], new: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "new": new}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_radixlm(engine, prompt: list[int], new: int) -> dict:
    t0 = time.perf_counter()
    out = engine.generate(input_ids=prompt, sampling_params={
        "max_new_tokens": new, "temperature": 0, "ignore_eos": True})
    total = time.perf_counter() - t0
    engine.flush_cache()  # no prefix reuse between runs: llama.cpp is reset too
    return {"ttft": out["meta_info"]["ttft"], "total": total,
            "tokens": out["meta_info"]["completion_tokens"]}


def metrics(run_short: dict, run_long: dict, long_len: int) -> dict:
    return {
        "single_decode_tok_s": (run_short["tokens"] - 1) / (run_short["total"]
                                                             - run_short["ttft"]),
        "ttft_s": run_short["ttft"],
        "prefill_tok_s": long_len / run_long["ttft"],
        "prefill_ttft_s": run_long["ttft"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=1800)
    ap.add_argument("--llama-python", default=None,
                    help="interpreter with llama_cpp (default .venv-llamacpp/bin/python)")
    ap.add_argument("--llama-extra-bufts", action="store_true",
                    help="let llama.cpp use AMX / repacked weights (crashes where AMX is "
                         "not granted, as on the development VM)")
    ap.add_argument("--native-activations", default="auto",
                    help="radixlm's native_activations (auto | fp32 | int8 | bf16), or a "
                         "comma list (e.g. fp32,int8): one engine each, alternating with "
                         "llama.cpp round by round; int8 is llama.cpp's own per-block "
                         "rounding of activations")
    ap.add_argument("--speculative-algorithm", default=None,
                    help="radixlm's speculative_algorithm (default: the engine's own, NGRAM "
                         "where native steps run; none: off). This prompt's greedy text "
                         "repeats itself, so n-gram drafts are nearly always accepted here")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.threads, args.llama_extra_bufts)
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    run(args)


def run(args) -> None:
    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.weights import gguf_source

    host = host_info()
    print(host_line(host), flush=True)
    modes = args.native_activations.split(",")
    engines = {}
    for mode in modes:  # "radixlm" for one mode (the JSON of earlier runs), else per mode
        name = "radixlm" if len(modes) == 1 else f"radixlm_{mode}"
        engines[name] = Engine(log_level="warning", native_activations=mode,
                               speculative_algorithm=args.speculative_algorithm)
        print(f"{name}: native_activations={mode}, speculative_algorithm="
              f"{args.speculative_algorithm or 'default'}; weights "
              f"{engines[name].runner.precision['weights']}, activations "
              f"{engines[name].runner.precision['activations']}", flush=True)
    first = next(iter(engines.values()))
    gguf = str(gguf_source(first.model_path))
    python = args.llama_python or str(ROOT / ".venv-llamacpp" / "bin" / "python")
    if not Path(python).exists():
        python = sys.executable
    llama = LlamaCpp(python, gguf, args.threads, args.llama_extra_bufts)
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(4 * args.prefill_tokens))
    ids = first.tokenizer.encode(text, add_special_tokens=False)
    short, long = ids[:64], ids[:args.prefill_tokens]
    for engine in engines.values():  # warm-up all
        run_radixlm(engine, short, 8)
    llama.run(short, 8)
    rounds = []
    for _ in range(args.rounds):
        r = {name: metrics(run_radixlm(engine, short, args.new_tokens),
                           run_radixlm(engine, long, 1), len(long))
             for name, engine in engines.items()}
        r["llama_cpp"] = metrics(llama.run(short, args.new_tokens), llama.run(long, 1),
                                 len(long))
        rounds.append(r)
        print(json.dumps(r), flush=True)
    llama.close()
    spec = {}
    for name, engine in engines.items():
        stats = engine.get_stats()
        spec[name] = {k: stats.get(k, 0) for k in ("spec_draft_tokens_total",
                                                   "spec_accepted_tokens_total")}
        engine.shutdown()
    report(args, host, llama, gguf, list(engines), rounds,
           {name: {**e.runner.precision, "speculation": spec[name]}
            for name, e in engines.items()})


def report(args, host, llama, gguf, names, rounds, precision) -> None:
    from radixlm.native.build import host_line

    keys = list(rounds[0]["llama_cpp"])
    results = {"host": host, "llama_cpp_version": llama.version,
               "llama_cpp_features": llama.features, "gguf": gguf,
               "threads": args.threads, "llama_extra_bufts": args.llama_extra_bufts,
               "speculative_algorithm": args.speculative_algorithm,
               "precision": precision, "rounds": rounds,
               **{n: {k: statistics.median(r[n][k] for r in rounds) for k in keys}
                  for n in [*names, "llama_cpp"]}}
    # ratio > 1: radixlm better (rates: ours / theirs; times: theirs / ours)
    for name in names:
        per_round = [{k: (r[name][k] / r["llama_cpp"][k] if k.endswith("tok_s")
                          else r["llama_cpp"][k] / r[name][k]) for k in keys} for r in rounds]
        suffix = name[len("radixlm"):]
        results[f"ratio_per_round{suffix}"] = per_round
        results[f"ratio_median{suffix}"] = {k: statistics.median(p[k] for p in per_round)
                                            for k in keys}
    print(json.dumps(results, indent=2))
    print(f"\n{host_line(host)}; llama-cpp-python {llama.version}, {args.threads} threads")
    print(f"llama.cpp built for: {llama.features}")
    for name in names:
        suffix = name[len("radixlm"):]
        print(f"{name}: weights {precision[name]['weights']}; activations "
              f"{precision[name]['activations']}; draft tokens accepted / drafted "
              f"{precision[name]['speculation']['spec_accepted_tokens_total']} / "
              f"{precision[name]['speculation']['spec_draft_tokens_total']}")
        print(f"{'metric':<22}{name:>14}{'llama.cpp':>11}{'ratio':>8}  per round (>1: radixlm)")
        for k in keys:
            per = " ".join(f"{p[k]:.2f}" for p in results[f"ratio_per_round{suffix}"])
            print(f"{k:<22}{results[name][k]:>14.3f}{results['llama_cpp'][k]:>11.3f}"
                  f"{results[f'ratio_median{suffix}'][k]:>8.2f}  {per}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
