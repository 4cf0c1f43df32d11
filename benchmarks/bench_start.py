"""Where an engine's start goes: a fresh process per round, its stages timed from the
interpreter's start to the engine being ready.

    .venv/bin/python benchmarks/bench_start.py [--model PATH] [--rounds 5]
        [--context-length N] [--json r.json]

Each round runs ``Engine(model)`` in a new interpreter (a start is only a start once) with the
engine's own stage functions wrapped by timers, on the threads the engine runs them on:

* main thread: ``imports`` (``radixlm.runtime.engine``: the engine's modules, no torch),
  ``config`` (the GGUF header walk and the config: ``load_hf_config``), ``early`` (a
  GGUF's weights planned and their ``arena`` made and populated: ``early.start``, which
  waits for ``vocabulary``), ``runtime`` (torch and the runtime:
  ``engine.runtime_classes``), ``runner`` (``ModelRunner``: the KV pool, the decoder on
  the placed weights; where nothing was placed early, the arena and the placement too),
  then ``scheduler`` and ``gc_freeze``;
* the engine's setup threads: ``vocabulary`` (``checked_vocabulary``: a GGUF's byte-level
  vocabulary built and checked), ``tokenizer`` (``start_tokenizer`` on it: a byte-level
  GGUF's without transformers; beside ``runtime``), ``place`` (``Arena.place_all``: the
  weights copied or repacked in, beside ``runtime`` where placed early) and ``grammar``
  (``grammar_setup.make_backend``: made after ready, not part of it; llguidance's
  tokenizer tables, which ``warm`` makes after that, not counted).

A stage is its wall time; the threads overlap but share the GIL. ``ready`` is the time
from the interpreter's start (``time.perf_counter`` against the process start time) to the
constructor's return. radixlm's modules are compiled to bytecode first, as an installed
package's are (``llamacpp_common.compile_bytecode``). Reported: the median per stage over
the rounds, and each round's ``ready``. Prints the host line (CPU model, cores, ISA
flags), a table and the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, os, sys, threading, time
def since_start():  # seconds since this process started (its start time in clock ticks)
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return up - ticks / os.sysconf("SC_CLK_TCK")
t_boot = time.perf_counter() - since_start()
stages = {}
def timed(name, fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - t
    return run
t = time.perf_counter()
import radixlm
from radixlm import envs
from radixlm.runtime import engine as E  # (first: as an engine's user imports it)
stages["imports"] = time.perf_counter() - t
from radixlm.native import arena
from radixlm.runtime import early
from radixlm.runtime import grammar_setup as G
for name, attr in (("config", "load_hf_config"), ("vocabulary", "checked_vocabulary"),
                   ("tokenizer", "start_tokenizer")):
    setattr(E, attr, timed(name, getattr(E, attr)))
runtime_classes = timed("runtime", E.runtime_classes)
def classes():
    runner, scheduler = runtime_classes()
    return timed("runner", runner), timed("scheduler", scheduler)
E.runtime_classes = classes
G.make_backend = timed("grammar", G.make_backend)
envs.freeze_gc = timed("gc_freeze", envs.freeze_gc)
arena.Arena.__init__ = timed("arena", arena.Arena.__init__)
arena.Arena.place_all = timed("place", arena.Arena.place_all)
early.start = timed("early", early.start)
engine = E.Engine(sys.argv[1], log_level="warning", **json.loads(sys.argv[2]))
stages["ready"] = time.perf_counter() - t_boot
stages["construct"] = time.perf_counter() - t - stages["imports"]
engine.shutdown()
print("STAGES " + json.dumps(stages), flush=True)
os._exit(0)
"""

ORDER = ("imports", "config", "vocabulary", "tokenizer", "early", "arena", "place", "runtime",
         "runner", "scheduler", "grammar", "gc_freeze", "construct", "ready")


def one_round(model: str, engine_args: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD, model, json.dumps(engine_args)],
                         capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("STAGES "):
            return json.loads(line[len("STAGES "):])
    raise RuntimeError(f"the round failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="an alias, HF directory or .gguf file")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context-length", type=int, default=None,
                    help="the engine's context_length (an 8B model's own 131072 needs more "
                         "memory than the 2-core hosts have)")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    from radixlm.hostinfo import host_line
    from radixlm.native.build import host_info

    host = host_line(host_info())
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from llamacpp_common import compile_bytecode

    print(compile_bytecode(ROOT / "radixlm"), flush=True)
    engine_args = {} if args.context_length is None else {"context_length": args.context_length}
    rounds = [one_round(args.model, engine_args) for _ in range(args.rounds)]
    median = {k: statistics.median(r[k] for r in rounds) for k in ORDER
              if all(k in r for r in rounds)}
    summary = {"host": host, "model": args.model, "rounds": rounds,
               "median_s": median}
    print(json.dumps(summary, indent=2))
    print(f"\n{host}\nmodel {args.model}; {args.rounds} fresh processes; seconds, "
          "medians (vocabulary, tokenizer: a setup thread beside runtime and runner; "
          "grammar: after ready)")
    for k, v in median.items():
        print(f"{k:<12}{v:8.3f}")
    print("ready per round: " + " ".join(f"{r['ready']:.2f}" for r in rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
