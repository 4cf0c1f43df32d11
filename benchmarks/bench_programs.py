"""SGLang-paper-style program benchmark: five frontend programs run with run_batch.

Workloads: few-shot multiple choice (MMLU-like, `select`), JSON decoding (`json_schema`),
ReAct agent (`select` + `gen` + a Python tool, several steps), tree of thought (`fork`),
multi-turn chat. Each runs in up to three modes on the in-process engine:

- `radix`: the frontend as designed (radix cache on, traced prefix pre-cached, forks commit
  their prefix, `select` scores all choices in one batched request);
- `no_radix`: the same with `Engine(disable_radix_cache=True)`;
- `independent`: radix cache on, but every model call goes out as its own request with no
  frontend help (no pre-caching, no fork commit, one request per `select` choice).

Reports throughput (programs/s), latency per program (mean, p50, p90), cache hit rate
(cached / prompt tokens from engine.get_stats()) and task accuracy; prints JSON and a table.

    python benchmarks/bench_programs.py [--num 16] [--workloads few_shot,json,...]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel

import radixlm as sgl
from radixlm.lang.backend.base import ChoiceScores, Prompt
from radixlm.lang.backend.runtime_engine import Runtime

# ---- workloads ---------------------------------------------------------------------------

CAPITALS = [
    ("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"),
    ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Russia", "Moscow"), ("China", "Beijing"),
    ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Peru", "Lima"),
    ("Ireland", "Dublin"), ("Norway", "Oslo"), ("Poland", "Warsaw"), ("Kenya", "Nairobi"),
    ("Cuba", "Havana"), ("Sweden", "Stockholm"), ("Canada", "Ottawa"), ("Chile", "Santiago"),
]


def mc_question(i: int, rng: random.Random) -> tuple[str, list[str], str]:
    """(question text, the options, the right option); scored cloze-style: the model picks
    among the options' texts (a 135M model cannot use answer letters)."""
    country, capital = CAPITALS[i % len(CAPITALS)]
    options = [capital] + rng.sample([c for _, c in CAPITALS if c != capital], 3)
    rng.shuffle(options)
    return f"Question: What is the capital of {country}?\nAnswer:", options, capital


_shot_rng = random.Random(1)
FEW_SHOT = "The following are multiple choice questions about world capitals.\n\n" + "".join(
    q + " " + gold + "\n\n" for q, _, gold in (mc_question(i, _shot_rng) for i in range(5)))


@sgl.function
def few_shot_mc(s, question, options):
    s += FEW_SHOT + question + " " + sgl.select("answer", options)


class Person(BaseModel):
    name: str
    age: int
    city: str


NAMES = ["Maria Lopez", "John Smith", "Aiko Tanaka", "Omar Haddad", "Lena Berg", "Raj Patel"]


@sgl.function
def json_decode(s, text):
    s += sgl.system("You extract facts from text as JSON with fields name, age and city.")
    s += sgl.user("Text: " + text)
    s += sgl.assistant(sgl.gen("json", json_schema=Person, max_tokens=40))


REACT_PREFIX = (
    "Answer the question with the tools. Actions: lookup (a fact), calculate (arithmetic), "
    "finish (final answer).\n\n"
    "Question: How tall is Mount Everest in metres, plus one?\n"
    "Action: lookup\nInput: Mount Everest\nObservation: 8849 metres.\n"
    "Action: calculate\nInput: 8849 + 1\nObservation: 8850\n"
    "Action: finish\nAnswer: 8850\n\n"
)
FACTS = {"eiffel tower": "330 metres.", "mount everest": "8849 metres.",
         "great wall": "21196 kilometres.", "nile": "6650 kilometres."}


def tool(action: str, arg: str) -> str:
    if action == "lookup":
        return FACTS.get(arg.strip().lower(), "unknown.")
    digits = "".join(ch for ch in arg if ch in "0123456789+-* ")
    try:
        return str(eval(digits, {"__builtins__": {}}))  # digits and operators only
    except Exception:
        return "error"


@sgl.function
def react(s, question, steps=3):
    s += REACT_PREFIX + "Question: " + question + "\n"
    for step in range(steps):
        s += "Action: " + sgl.select(f"action_{step}", ["lookup", "calculate", "finish"])
        if s[f"action_{step}"] == "finish":
            break
        s += "\nInput: " + sgl.gen(f"input_{step}", max_tokens=8, stop="\n")
        s += "\nObservation: " + tool(s[f"action_{step}"], s[f"input_{step}"]) + "\n"
    s += "\nAnswer: " + sgl.gen("answer", max_tokens=8, stop="\n")


@sgl.function
def tree_of_thought(s, question):
    s += sgl.system("You are a thoughtful assistant who considers several ideas.")
    s += sgl.user(question)
    s += sgl.assistant_begin()
    forks = s.fork(3)
    forks += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=12, stop="\n")
    forks.join()
    s += "Ideas:\n" + "".join(f"- {idea.strip()}\n" for idea in s["idea"])
    s += "Best idea:" + sgl.gen("summary", max_tokens=12, stop="\n")
    s += sgl.assistant_end()


CHAT_SYSTEM = ("You are a concise travel assistant. You answer in one short sentence and you "
               "always mention the city the user asked about.")


@sgl.function
def multi_turn(s, city):
    s += sgl.system(CHAT_SYSTEM)
    for i, q in enumerate([f"I am visiting {city}. What should I see first?",
                           "What food should I try there?", "Any tip for getting around?"]):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"turn_{i}", max_tokens=12))


def make_workloads(num: int) -> dict[str, tuple[Any, list[dict], Any]]:
    """name -> (program, batch arguments, accuracy function(states, args) or None)."""
    rng = random.Random(0)
    mc = [mc_question(i + 5, rng) for i in range(num)]

    def mc_acc(states, _):
        return sum(s["answer"] == gold for s, (_, _, gold) in zip(states, mc, strict=True)) / num

    people = [{"text": f"{NAMES[i % len(NAMES)]} is {20 + i} years old and lives in "
                       f"{CAPITALS[i % len(CAPITALS)][1]}."} for i in range(num)]

    def json_acc(states, _):
        ok = 0
        for s in states:
            try:
                Person.model_validate(json.loads(s["json"]))
                ok += 1
            except Exception:
                pass
        return ok / num

    topics = list(FACTS)
    react_args = [{"question": f"How long is the {topics[i % 4].title()}, times {i % 3 + 2}?"}
                  for i in range(num)]
    tot_args = [{"question": f"How could a town of {1000 * (i + 1)} people save water?"}
                for i in range(num)]
    chat_args = [{"city": CAPITALS[i % len(CAPITALS)][1]} for i in range(num)]
    return {
        "few_shot_mc": (few_shot_mc, [{"question": q, "options": o} for q, o, _ in mc],
                        mc_acc),
        "json": (json_decode, people, json_acc),
        "react": (react, react_args, None),
        "tree_of_thought": (tree_of_thought, tot_args, None),
        "multi_turn": (multi_turn, chat_args, None),
    }


# ---- the "independent requests" baseline ---------------------------------------------------

class IndependentRuntime(Runtime):
    """Same engine, no frontend help: one request per select choice, nothing pre-cached."""

    def cache_prefix(self, prefix: str) -> None:
        return None

    def score_choices(self, prompt: Prompt, choices: list[str],
                      need_unconditional: bool) -> ChoiceScores:
        parts = [super(IndependentRuntime, self).score_choices(prompt, [c], need_unconditional)
                 for c in choices]
        return ChoiceScores([p.input_token_logprobs[0] for p in parts],
                            [p.unconditional_token_logprobs[0] for p in parts]
                            if need_unconditional else None)


# ---- running -------------------------------------------------------------------------------

def run_one(backend: Runtime, name: str, program: Any, args: list[dict], acc_fn: Any,
            precache: bool, num_threads: int) -> dict[str, Any]:
    backend.engine.flush_cache()
    stats0 = backend.engine.get_stats()
    latencies: list[float] = []

    def timed(**kw: Any) -> Any:
        t = time.perf_counter()
        state = program.run(backend=backend, temperature=0, **kw)
        state.sync()
        latencies.append(time.perf_counter() - t)
        return state

    t0 = time.perf_counter()
    if precache:
        program.precache(backend)
    with ThreadPoolExecutor(num_threads) as pool:
        states = list(pool.map(lambda kw: timed(**kw), args))
    elapsed = time.perf_counter() - t0
    stats = backend.engine.get_stats()
    cached = stats["cached_tokens_total"] - stats0["cached_tokens_total"]
    prompt = stats["prompt_tokens_total"] - stats0["prompt_tokens_total"]
    errors = [repr(s.error()) for s in states if s.error() is not None]
    out: dict[str, Any] = {
        "workload": name, "programs": len(args), "seconds": round(elapsed, 3),
        "throughput_programs_per_s": round(len(args) / elapsed, 3),
        "latency_mean_s": round(statistics.mean(latencies), 3),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_p90_s": round(sorted(latencies)[int(0.9 * (len(latencies) - 1))], 3),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "cache_hit_rate": round(cached / prompt, 3) if prompt else 0.0,
        "requests": stats["num_requests_total"] - stats0["num_requests_total"],
        "errors": len(errors),
    }
    if errors:
        out["first_error"] = errors[0][:200]
    if acc_fn is not None and not errors:
        out["accuracy"] = round(acc_fn(states, args), 3)
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput, with every run's throughput attached."""
    ordered = sorted(runs, key=lambda r: r["throughput_programs_per_s"])
    res = dict(ordered[len(ordered) // 2])
    res["throughput_all_runs"] = [r["throughput_programs_per_s"] for r in runs]
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num", type=int, default=16, help="programs per workload")
    parser.add_argument("--num-threads", type=int, default=16)
    parser.add_argument("--workloads", default="few_shot_mc,json,react,tree_of_thought,"
                                               "multi_turn")
    parser.add_argument("--modes", default="radix,no_radix,independent")
    parser.add_argument("--max-total-tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    parser.add_argument("--out", help="also write the JSON results here")
    args = parser.parse_args()

    from radixlm.native.build import host_info, host_line

    host = host_info()
    print(host_line(host), file=sys.stderr, flush=True)
    workloads = make_workloads(args.num)
    names = [w for w in args.workloads.split(",") if w]
    unknown = set(names) - set(workloads)
    if unknown:
        sys.exit(f"unknown workloads {sorted(unknown)}; choose from {sorted(workloads)}")
    results = []
    modes = [m for m in args.modes.split(",") if m]
    for disable in (False, True):
        engine_modes = [m for m in modes if (m == "no_radix") == disable]
        if not engine_modes:
            continue
        from radixlm.runtime.engine import Engine

        engine = Engine(model=args.model, disable_radix_cache=disable,
                        max_total_tokens=args.max_total_tokens)
        try:
            backends = {m: (IndependentRuntime if m == "independent" else Runtime)(engine)
                        for m in engine_modes}
            for name in names:  # warm-up (first shapes, allocator); not measured
                program, batch, _ = workloads[name]
                run_one(backends[engine_modes[0]], name, program, batch[:2], None, True,
                        args.num_threads)
            for name in names:
                program, batch, acc_fn = workloads[name]
                runs: dict[str, list[dict[str, Any]]] = {m: [] for m in engine_modes}
                for _ in range(args.repeats):  # modes interleaved so load drift hits all
                    for mode in engine_modes:
                        runs[mode].append(run_one(backends[mode], name, program, batch, acc_fn,
                                                  precache=mode != "independent",
                                                  num_threads=args.num_threads))
                for mode in engine_modes:
                    res = median_run(runs[mode])
                    res["mode"] = mode
                    results.append(res)
                    print(json.dumps(res), file=sys.stderr, flush=True)
        finally:
            engine.shutdown()

    print(json.dumps({"host": host, "model": args.model, "num": args.num, "results": results},
                     indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "num": args.num, "results": results}, f, indent=1)
    header = (f"{'workload':<16} {'mode':<12} {'prog/s':>7} {'lat p50':>8} {'lat p90':>8} "
              f"{'hit rate':>8} {'requests':>8} {'acc':>5} {'err':>4}")
    print(header)
    print("-" * len(header))
    for r in sorted(results, key=lambda r: (names.index(r["workload"]), modes.index(r["mode"]))):
        acc = f"{r['accuracy']:.2f}" if "accuracy" in r else "-"
        print(f"{r['workload']:<16} {r['mode']:<12} {r['throughput_programs_per_s']:>7.2f} "
              f"{r['latency_p50_s']:>8.2f} {r['latency_p90_s']:>8.2f} "
              f"{r['cache_hit_rate']:>8.2f} {r['requests']:>8} {acc:>5} {r['errors']:>4}")


if __name__ == "__main__":
    main()
