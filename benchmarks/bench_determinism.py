"""One answer per prompt: N chat prompts, greedy, asked alone on a flushed cache (the
reference), then again under each axis that must not change a token's numbers, counting the
answers whose token ids AND output logprobs are identical bit for bit to the reference.

    .venv/bin/python benchmarks/bench_determinism.py [--model PATH] [--prompts 16]
        [--new-tokens 32] [--batches 1,4,16,64] [--activations auto] [--torch-path]
        [--deterministic] [--cost-rounds N] [--out FILE]

Axes (one engine per engine-level setting, the cache flushed between axes):
- ``hit``: each prompt again alone, its earlier run in the radix tree;
- ``batch-B``: all prompts in one call of B requests (the N prompts repeated to B), cold;
- ``shared-prefix``: a shared system prompt asked once first (cached), then each prompt
  alone (the reference prompts carry the same system prompt);
- ``chunk-C``: an engine with ``chunked_prefill_size=C`` (prompts split over steps);
- ``spec``: an engine with n-gram speculation on (verify steps of several tokens).

Throughput of the same runs (generated tokens per second of wall time) is printed beside the
counts. Prints the host line first, JSON and a table at the end.

``--torch-path``: every engine on the torch path (``weight_quant="none"``);
``--deterministic``: with ``enable_deterministic_inference``. ``--cost-rounds N``: instead
of the axes, the flag's cost on the torch path: an engine without and one with the flag,
alternated N times (the order swapped every round), each timing a prefill (the prompts'
text as one prompt of up to 512 tokens, one new token), one stream of ``--new-tokens`` and
a batch of 16; the per-round ratios (with / without) and their median.
"""

from __future__ import annotations

import radixlm  # noqa: F401  # isort: skip  (before torch: OpenMP's spin-wait bound)

import argparse
import json
import statistics
import sys
import time

from radixlm.hostinfo import host_line
from radixlm.native.build import host_info
from radixlm.runtime.engine import Engine

SYSTEM = "You are a concise assistant. Answer in one or two sentences."
QUESTIONS = [
    "What is the capital of France?", "Name three primary colors.",
    "How many legs does a spider have?", "What is 12 times 7?",
    "Write a haiku about rain.", "Who wrote Romeo and Juliet?",
    "What does a CPU do?", "Give me a synonym for happy.",
    "Why is the sky blue?", "What is the boiling point of water?",
    "Translate 'good morning' into Spanish.", "What is photosynthesis?",
    "List two uses of copper.", "How far is the Moon from Earth?",
    "What is a prime number?", "Describe a cat in five words.",
]


def prompts(engine: Engine, n: int) -> list[str]:
    """``n`` chat-templated prompts with the shared system prompt."""
    qs = [QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})")
          for i in range(n)]
    return [engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        tokenize=False, add_generation_prompt=True) for q in qs]


def answer(out: dict) -> tuple:
    """A run's identity: token ids and output logprobs (bits)."""
    lps = out["meta_info"]["output_token_logprobs"]
    return tuple((tid, lp) for lp, tid, _ in lps)


def ask(engine: Engine, texts: list[str], new_tokens: int) -> tuple[list[tuple], float, int]:
    """One call for all ``texts``: answers, wall seconds, generated tokens."""
    t = time.perf_counter()
    outs = engine.generate(texts, {"max_new_tokens": new_tokens, "temperature": 0.0},
                           return_logprob=True)
    dt = time.perf_counter() - t
    return [answer(o) for o in outs], dt, sum(o["meta_info"]["completion_tokens"] for o in outs)


def run_axes(engine: Engine, texts: list[str], ref: list[tuple] | None, args,
             axes: list[str]) -> tuple[list[tuple], dict]:
    """The reference (alone, cold; taken here when ``ref`` is None) and the named axes."""
    rows: dict[str, dict] = {}

    def score(name: str, got: list[tuple], dt: float, toks: int) -> None:
        same = sum(a == b for a, b in zip(got, ref))
        rows[name] = {"identical": same, "of": len(ref), "tok_s": round(toks / dt, 1)}

    alone, dt, toks = [], 0.0, 0
    for t in texts:
        engine.flush_cache()
        a, d, k = ask(engine, [t], args.new_tokens)
        alone += a
        dt += d
        toks += k
    if ref is None:
        ref = alone
    score("alone-cold", alone, dt, toks)
    if "hit" in axes:
        got, dt, toks = [], 0.0, 0
        for t in texts:  # each prompt's own earlier run is in the tree
            engine.generate(t, {"max_new_tokens": args.new_tokens, "temperature": 0.0})
            a, d, k = ask(engine, [t], args.new_tokens)
            got += a
            dt += d
            toks += k
        score("hit", got, dt, toks)
    for b in args.batch_sizes if "batch" in axes else []:
        engine.flush_cache()
        reps = [texts[i % len(texts)] for i in range(max(b, len(texts)))]
        got, dt, toks = ask(engine, reps, args.new_tokens)
        score(f"batch-{b}", [got[i] for i in range(len(texts))], dt, toks)
    if "shared-prefix" in axes:
        engine.flush_cache()
        head = texts[0][:texts[0].index(QUESTIONS[0])]  # the system turn and the user tag
        engine.generate(head, {"max_new_tokens": 1, "temperature": 0.0})
        got, dt, toks = [], 0.0, 0
        for t in texts:
            a, d, k = ask(engine, [t], args.new_tokens)
            got += a
            dt += d
            toks += k
        score("shared-prefix", got, dt, toks)
    return ref, rows


def timings(engine: Engine, texts: list[str], long_ids: list[int], new_tokens: int) -> dict:
    """Prefill tok/s (``long_ids``, cold, one new token), one stream's and a batch of 16's
    generated tok/s (cold, ``new_tokens`` each, EOS ignored)."""
    params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=long_ids, sampling_params={**params, "max_new_tokens": 1})
    out = {"prefill": len(long_ids) / (time.perf_counter() - t)}
    for name, batch in (("stream", texts[:1]), ("batch16", [texts[i % len(texts)]
                                                           for i in range(16)])):
        engine.flush_cache()
        t = time.perf_counter()
        engine.generate(batch, params)
        out[name] = len(batch) * new_tokens / (time.perf_counter() - t)
    return out


def cost_rounds(args) -> dict:
    """The flag's cost on the torch path, engines alternated (see the module docstring)."""
    kw = {"weight_quant": "none", "speculative_algorithm": "none", "log_level": "warning"}
    engines = {"off": Engine(args.model, **kw),
               "on": Engine(args.model, enable_deterministic_inference=True, **kw)}
    try:
        assert engines["on"].batch_invariant and not engines["off"].batch_invariant
        texts = prompts(engines["off"], args.prompts)
        long_ids = engines["off"].tokenizer.encode(" ".join(texts))[:512]
        for e in engines.values():  # warm-up: first-call costs out of the rounds
            timings(e, texts, long_ids[:64], 4)
        rounds = []
        for r in range(args.cost_rounds):
            got = {}
            for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
                got[name] = timings(engines[name], texts, long_ids, args.new_tokens)
            rounds.append(got)
            print(json.dumps(got), flush=True)
    finally:
        for e in engines.values():
            e.shutdown()
    result = {"host": host_info(), "model": args.model or "embedded", "rounds": rounds,
              "prefill_tokens": len(long_ids), "ratio": {}}
    print(f"{'metric':<10} {'off tok/s':>10} {'on tok/s':>10} {'on/off':>7}  per round")
    for metric in ("prefill", "stream", "batch16"):
        ratios = [r["on"][metric] / r["off"][metric] for r in rounds]
        result["ratio"][metric] = statistics.median(ratios)
        off = statistics.median(r["off"][metric] for r in rounds)
        on = statistics.median(r["on"][metric] for r in rounds)
        print(f"{metric:<10} {off:>10.1f} {on:>10.1f} {result['ratio'][metric]:>6.2f}x  "
              + ", ".join(f"{x:.2f}" for x in ratios))
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--chunks", default="16,64")
    p.add_argument("--activations", default="auto")
    p.add_argument("--torch-path", action="store_true", help="weight_quant=none")
    p.add_argument("--deterministic", action="store_true",
                   help="enable_deterministic_inference")
    p.add_argument("--cost-rounds", type=int, default=0,
                   help="only the flag's cost on the torch path, in N alternated rounds")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batches.split(",") if b]
    print(host_line(host_info()), flush=True)
    if args.cost_rounds:
        result = cost_rounds(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)
        return result
    base = ({"weight_quant": "none"} if args.torch_path
            else {"native_activations": args.activations})
    base.update(enable_deterministic_inference=args.deterministic, log_level="warning")
    rows: dict[str, dict] = {}
    with Engine(args.model, **base) as engine:
        texts = prompts(engine, args.prompts)
        ref, r = run_axes(engine, texts, None, args, ["hit", "batch", "shared-prefix"])
        rows.update(r)
        info = {"weights": engine.runner.describe() if hasattr(engine.runner, "describe")
                else None}
    for c in [int(c) for c in args.chunks.split(",") if c]:
        with Engine(args.model, chunked_prefill_size=c, **base) as engine:
            _, r = run_axes(engine, texts, ref, args, [])
            rows[f"chunk-{c}"] = r["alone-cold"]
    with Engine(args.model, speculative_algorithm="NGRAM", **base) as engine:
        _, r = run_axes(engine, texts, ref, args, ["batch"])
        rows["spec"] = r["alone-cold"]
        rows.update({f"spec-{k}": v for k, v in r.items() if k.startswith("batch")})
    result = {"host": host_info(), "model": args.model or "embedded", "info": info,
              "activations": "torch path" if args.torch_path else args.activations,
              "deterministic": args.deterministic, "rows": rows}
    print(json.dumps(result, default=str))
    print(f"{'axis':<16} {'identical':>10} {'tok/s':>8}")
    for name, row in rows.items():
        print(f"{name:<16} {row['identical']:>4}/{row['of']:<5} {row['tok_s']:>8}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
