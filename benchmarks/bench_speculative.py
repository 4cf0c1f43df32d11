"""Speculative decoding without a draft model (``speculative_algorithm="NGRAM"``) on input-
grounded tasks and free chat: radixlm with speculation on vs off, and llama.cpp plain vs its
prompt-lookup draft (``LlamaPromptLookupDecoding``), same GGUF, same token ids.

    make bench-speculative
    .venv/bin/python benchmarks/bench_speculative.py [--rounds 3] [--prompts 4]
        [--new-tokens 160] [--batches 16,64] [--threads N] [--skip-llama] [--quick]
        [--tasks json,rewrite] [--out FILE]

Tasks (``spec_tasks.py``): rewrite (proofread / formal tone / bullet points of a passage),
quote-extract, JSON extraction under a schema (``json_schema``; llama.cpp gets the same schema
as a grammar), a three-turn agent loop whose turns re-read tool results (later turns are
built from the first turns' answers with speculation off, so every system gets the same
token ids), and free chat. Chat-templated for the instruct model; greedy; each request stops
at EOS or ``--new-tokens``; the prefix cache is flushed before every radixlm run (llama.cpp
is reset too), so no run replays another.

What it reports, in this order:

1. The host line.
2. Greedy outputs with speculation off, then an **offline replay** of the drafter
   (``NgramDrafter``) over them: at every step the drafter proposes from the request's
   tokens so far, the proposal is compared with the actual continuation, the accepted part
   plus one token advance the position, and the drafter observes the result, exactly as a
   verifying step would. Per task: draft steps / steps, acceptance length (tokens per
   step, SGLang's ``accept_length``), accepted / drafted, and an estimated speedup from the
   measured cost of a k-token step relative to a one-token step on this host (the native
   library's verify step timed directly where it runs, else prefix-cached TTFTs). A "rerun"
   row replays each prompt once more with its earlier run in the radix tree (the tree
   source). Tokens jump-forward forced under a JSON schema cost no model step on either
   side (found by replaying the grammar over the output) and are left out of the counts.
3. Online rounds, alternating the systems prompt by prompt: single-stream decode tok/s per
   task and the ratios per round (on/off, llama.cpp lookup/plain, radixlm on vs llama.cpp
   lookup), then batch 16/64 throughput (a mix of all tasks) on vs off. Greedy text
   identity on vs off per prompt (and llama.cpp lookup vs plain, reported only: its
   verification is not bit-exact with its one-token steps on every prompt). Without the
   speculation engine option (the speculative step not built yet) the on side is skipped
   with a note and the rest still runs.

JSON then a table at the end.
"""

from __future__ import annotations

# radixlm before torch (it bounds OpenMP's spin-wait, which libgomp reads once, when torch
# loads it)
try:
    import radixlm  # noqa: F401  # isort: skip
except ImportError:  # the llama.cpp worker runs in llama.cpp's own venv
    pass

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_common import add_extra_bufts_arg, extra_bufts_on  # noqa: E402
from spec_tasks import agent_turn, build_prompts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("rewrite", "quote", "json", "agent", "chat")
GROUNDED = ("rewrite", "quote", "json", "agent")
# issue 21's single-stream targets, speculation on vs off
TARGETS = {"rewrite": 1.5, "quote": 1.5, "agent": 1.5, "json": 1.3, "chat": 0.97}
AGENT_TURNS = 3


# ---------------------------------------------------------------- llama.cpp worker
def worker(gguf: str, threads: int, extra_bufts: bool, num_pred: int) -> None:
    """Reads one JSON job a line ({"prompt": ids, "new": n, "mode": "plain" | "lookup",
    "stop": ids, "schema": dict | null}), answers {"ttft", "total", "ids"} a line. One
    ``Llama`` per mode (the lookup one needs logits for every position)."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    from llamacpp_common import announce_ready, use_plain_buffers

    if not extra_bufts:
        use_plain_buffers(llama_cpp)
    common = {"model_path": gguf, "n_ctx": 2048, "n_threads": threads,
              "n_threads_batch": threads, "n_batch": 512, "verbose": False}
    # logits_all=True said explicitly: with a draft model llama-cpp-python keeps logits of
    # every position but sizes that buffer from the argument (n_batch rows otherwise, and
    # a sequence past 512 tokens fails to broadcast)
    models = {"plain": llama_cpp.Llama(**common),
              "lookup": llama_cpp.Llama(**common, logits_all=True,
                                        draft_model=LlamaPromptLookupDecoding(
                                            num_pred_tokens=num_pred))}
    announce_ready(llama_cpp)
    grammars: dict[str, object] = {}
    for line in sys.stdin:
        job = json.loads(line)
        llm = models[job["mode"]]
        grammar = None
        if job.get("schema"):
            key = json.dumps(job["schema"], sort_keys=True)
            if key not in grammars:
                grammars[key] = llama_cpp.LlamaGrammar.from_json_schema(key, verbose=False)
            grammar = grammars[key]
        stop = set(job["stop"])
        llm.reset()
        t0 = time.perf_counter()
        first, ids = None, []
        for tok in llm.generate(job["prompt"], top_k=1, top_p=1.0, temp=0.0, reset=True,
                                grammar=grammar):
            ids.append(int(tok))
            if first is None:
                first = time.perf_counter() - t0
            if tok in stop or len(ids) >= job["new"]:
                break
        total = time.perf_counter() - t0
        print(json.dumps({"ttft": first, "total": total, "ids": ids}), flush=True)


class LlamaCpp:
    def __init__(self, python: str, gguf: str, threads: int, extra_bufts: bool,
                 num_pred: int) -> None:
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", gguf, "--threads", str(threads),
             "--llama-num-pred", str(num_pred)]
            + ["--llama-extra-bufts", "on" if extra_bufts else "off"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.version, self.features = ready["ready"], ready.get("features", "")

    def run(self, mode: str, case: Case, new: int, stop: list[int]) -> dict:
        job = {"prompt": case.ids, "new": new, "mode": mode, "stop": stop,
               "schema": case.schema}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return {"ttft": out["ttft"], "total": out["total"], "ids": out["ids"]}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---------------------------------------------------------------- cases and radixlm runs
@dataclass
class Case:
    """One single-stream request: token ids, its schema, and its output with speculation
    off (the reference for identity and for the offline replay)."""

    task: str
    name: str
    ids: list[int]
    schema: dict | None = None
    ref_ids: list[int] = field(default_factory=list)
    ref_text: str = ""
    free: list[int] = field(default_factory=list)  # output positions jump-forward forced


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def run_radixlm(engine, case: Case, new: int) -> dict:
    params = {"max_new_tokens": new, "temperature": 0}
    if case.schema is not None:
        params["json_schema"] = json.dumps(case.schema)
    engine.flush_cache()  # no run replays another through the tree
    t0 = time.perf_counter()
    out = engine.generate(input_ids=case.ids, sampling_params=params)
    total = time.perf_counter() - t0
    return {"ttft": out["meta_info"]["ttft"], "total": total, "ids": out["output_ids"],
            "text": out["text"], "meta": out["meta_info"]}


def build_cases(engine, tasks: tuple[str, ...], count: int, new: int) -> list[Case]:
    """Every task's prompts as token ids, with their outputs with speculation off; agent
    loops run turn by turn, each turn's prompt holding the earlier answers."""
    tok = engine.tokenizer
    cases: list[Case] = []
    for task in tasks:
        for p in build_prompts(task, count):
            if task != "agent":
                case = Case(task, p.name, chat_ids(tok, p.messages), p.json_schema)
                _reference(engine, case, new)
                cases.append(case)
                continue
            answers: list[str] = []
            for turn in range(AGENT_TURNS):
                case = Case(task, f"{p.name}-t{turn}", chat_ids(tok, agent_turn(p, answers)))
                _reference(engine, case, new)
                answers.append(case.ref_text)
                cases.append(case)
    return cases


def _reference(engine, case: Case, new: int) -> None:
    out = run_radixlm(engine, case, new)
    case.ref_ids, case.ref_text = out["ids"], out["text"]
    if case.schema is not None:
        case.free = forced_positions(engine, case)


def forced_positions(engine, case: Case) -> list[int]:
    """Output positions of ``case.ref_ids`` that jump-forward appended without a model step
    (the engine's postprocess replayed over the grammar: accept the sampled token, then
    apply the forced continuation). A sampled token that a rollback retokenized still
    counts as a step."""
    from radixlm.constraints import spec_from_sampling_params

    spec = spec_from_sampling_params({"json_schema": json.dumps(case.schema)},
                                     engine.config.json_whitespace)
    grammar = engine.grammar_backend.compile_async(spec).result()
    ref, out, sampled, forced = case.ref_ids, [], set(), set()
    while len(out) < len(ref):
        sampled.add(len(out))
        out.append(ref[len(out)])
        if not grammar.accept_token(out[-1]) or grammar.is_terminated():
            break
        plan = grammar.jump_forward(out)
        if plan is None or not plan.token_ids:
            continue
        if plan.rollback:
            del out[-plan.rollback:]
        forced.update(range(len(out), len(out) + len(plan.token_ids)))
        out += plan.token_ids
        if out != ref[:len(out)]:  # not the engine's path: count every token as a step
            return []
    return sorted(forced - sampled)


# ---------------------------------------------------------------- offline replay
STEP_SIZES = (1, 2, 3, 5, 9, 17)


def step_costs(engine, ids: list[int], repeats: int = 3) -> dict:
    """Cost of a step verifying j - 1 drafts relative to a one-token decode step, on this
    host: the native library's step itself where it runs (``native_step_costs``), else from
    TTFTs with the prefix cached (``prefill_step_costs``: an extend, not a verify step)."""
    if getattr(engine.runner, "native", None) is not None:
        return native_step_costs(engine, len(ids), repeats)
    return prefill_step_costs(engine, ids, repeats=repeats)


def native_step_costs(engine, context: int, repeats: int = 3, steps: int = 10) -> dict:
    """One request with ``context`` positions of K/V and j new tokens at one-token rounding
    (``act_rows=1``, as a verify step runs), timed on the native library directly, relative
    to j = 1. Writes K/V into free slots of the idle engine's pool (the cache is flushed
    first and after; timing only)."""
    import torch

    from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

    runner = engine.runner
    engine.flush_cache()
    end = context + max(STEP_SIZES)
    runner.pool.req_to_token[0, :end] = torch.arange(1, end + 1)

    def t(values):
        return torch.tensor(values, dtype=torch.int64)

    def batch(j: int) -> ForwardBatch:
        return ForwardBatch(
            ForwardMode.EXTEND, t([17 + i for i in range(j)]), t(range(context, context + j)),
            t(range(1 + context, 1 + context + j)), t([0]), t([context + j]), t([context]),
            t([j]), t([0]), t(range(j)), [context + j], [context], [j], [1_000_000],
            act_rows=1)

    times: dict[int, list[float]] = {j: [] for j in STEP_SIZES}
    for _ in range(repeats):
        for j in STEP_SIZES:
            fb = batch(j)
            runner.native.forward(fb)
            t0 = time.perf_counter()
            for _ in range(steps):
                runner.native.forward(fb)
            times[j].append((time.perf_counter() - t0) / steps)
    engine.flush_cache()
    base = statistics.median(times[1])
    return {"method": "native verify steps", "decode_step_s": base,
            "relative": {j: statistics.median(v) / base for j, v in times.items()}}


def prefill_step_costs(engine, ids: list[int], sizes=STEP_SIZES, repeats: int = 3) -> dict:
    """Cost of a step over j new tokens relative to a one-token decode step, on this host:
    ``1 + (ttft(prefix + j) - ttft(prefix + 1)) / decode_step`` with the prefix cached."""
    tail = max(sizes)
    prefix = ids[:-tail]
    decode = []
    for _ in range(repeats):
        engine.flush_cache()
        out = engine.generate(input_ids=ids, sampling_params={
            "max_new_tokens": 33, "temperature": 0, "ignore_eos": True})
        m = out["meta_info"]
        decode.append((m["e2e_latency"] - m["ttft"]) / 32)
    step = statistics.median(decode)
    ttft: dict[int, list[float]] = {j: [] for j in sizes}
    for _ in range(repeats):
        for j in sizes:
            engine.flush_cache()
            engine.generate(input_ids=prefix, sampling_params={"max_new_tokens": 1})
            out = engine.generate(input_ids=ids[:len(prefix) + j],
                                  sampling_params={"max_new_tokens": 1})
            ttft[j].append(out["meta_info"]["ttft"])
    base = statistics.median(ttft[1])
    rel = {j: max(1.0, 1 + (statistics.median(ttft[j]) - base) / step) for j in sizes}
    return {"method": "prefix-cached TTFTs", "decode_step_s": step, "relative": rel}


def cost_of(costs: dict[int, float], tokens: int) -> float:
    """Relative cost of a step over ``tokens`` tokens, linear between measured sizes."""
    sizes = sorted(costs)
    if tokens <= sizes[0]:
        return costs[sizes[0]]
    if tokens >= sizes[-1]:
        a, b = sizes[-2], sizes[-1]
    else:
        i = bisect.bisect_left(sizes, tokens)
        a, b = sizes[i - 1], sizes[i]
    return costs[a] + (costs[b] - costs[a]) * (tokens - a) / (b - a)


def replay(drafter, case: Case, max_draft: int, costs: dict[int, float], uid: int) -> dict:
    """Drive ``drafter`` over ``case.ref_ids`` as a verifying step would (see the module
    docstring); returns counts, the estimated cost and the drafter's time per call."""
    out, free = case.ref_ids, set(case.free)
    req = SimpleNamespace(uid=uid, input_ids=case.ids, output_ids=[],
                          params=SimpleNamespace(max_new_tokens=len(out) + 1,
                                                 json_schema=case.schema))
    pos = steps = draft_steps = drafted = accepted = 0
    cost, spent, calls = 0.0, 0.0, 0
    while pos < len(out):
        if pos in free:  # forced by jump-forward: no model step, on or off
            pos += 1
            continue
        req.output_ids = out[:pos]
        t0 = time.perf_counter()
        draft = drafter.propose(req, max_draft)
        spent, calls = spent + time.perf_counter() - t0, calls + 1
        ok = 0
        while ok < len(draft) and pos + ok < len(out) and draft[ok] == out[pos + ok]:
            ok += 1
        if draft:
            drafter.observe(req, len(draft), ok)
            draft_steps, drafted, accepted = draft_steps + 1, drafted + len(draft), accepted + ok
        cost += cost_of(costs, len(draft) + 1)
        steps, pos = steps + 1, pos + ok + 1
    drafter.release(req)
    return {"tokens": len(out) - len(free), "steps": steps, "draft_steps": draft_steps,
            "drafted": drafted, "accepted": accepted, "cost": cost, "propose_s": spent,
            "calls": calls}


def replay_tasks(cases: list[Case], costs: dict[int, float], max_draft: int,
                 drafter_kwargs: dict) -> dict:
    """The offline table: per task, and a "rerun" row with each case's earlier run cached."""
    from radixlm.radix import RadixCache
    from radixlm.runtime.speculative.ngram import NgramDrafter

    rows: dict[str, list[dict]] = {}
    for i, case in enumerate(cases):
        cache = RadixCache(lambda slots: None)
        cache.insert(case.ids, list(range(len(case.ids))))  # the prompt after prefill
        drafter = NgramDrafter(cache, max_draft_tokens=max_draft, **drafter_kwargs)
        rows.setdefault(case.task, []).append(replay(drafter, case, max_draft, costs, i))
        seq = case.ids + case.ref_ids
        cache.insert(seq, list(range(len(seq))))  # its run, as a later rerun finds it
        rows.setdefault("rerun", []).append(replay(drafter, case, max_draft, costs, -i - 1))
    return {task: summarize(r) for task, r in rows.items()}


def summarize(rows: list[dict]) -> dict:
    total = {k: sum(r[k] for r in rows) for k in rows[0]}
    return {"prompts": len(rows), "tokens": total["tokens"], "steps": total["steps"],
            "draft_step_fraction": total["draft_steps"] / max(total["steps"], 1),
            "accept_length": total["tokens"] / max(total["steps"], 1),
            "accept_rate": total["accepted"] / max(total["drafted"], 1),
            "accepted_per_draft": total["accepted"] / max(total["draft_steps"], 1),
            "est_speedup": total["tokens"] / max(total["cost"], 1e-9),
            "propose_us": 1e6 * total["propose_s"] / max(total["calls"], 1)}


# ---------------------------------------------------------------- drafter cost at 4k
def drafter_cost(tokenizer, context: int = 4096, steps: int = 400) -> dict:
    """Microseconds per ``propose`` + ``observe`` at a ``context``-token sequence of real
    text growing a token per call, every draft observed as accepted (so it never pauses),
    and the one-off cost of indexing the prompt on the first call. Scenarios: prompt lookup
    only; the tree holding sequences that branch off the prompt but none that continues
    it (``tree_miss``); the tree holding this very run (``tree_hit``, drafts from it)."""
    from radixlm.radix import RadixCache
    from radixlm.runtime.speculative.ngram import NgramDrafter

    prompts = build_prompts("rewrite", 24) + build_prompts("chat", 8)
    text = "\n\n".join(p.messages[-1]["content"] for p in prompts)
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < context + steps:
        ids = ids + ids
    prompt, future = ids[:context], ids[context:context + steps]
    miss = RadixCache(lambda slots: None)
    for cut in (context // 4, context // 2, context - 64):  # sequences branching off it
        branch = prompt[:cut] + list(range(90_000, 90_000 + 256))
        miss.insert(branch, list(range(len(branch))))
    miss.insert(prompt, list(range(len(prompt))))
    hit = RadixCache(lambda slots: None)
    hit.insert(prompt + future, list(range(context + steps)))
    out: dict[str, float] = {"context_tokens": context}
    for label, cache, use_tree in (("ngram_only", miss, False), ("tree_miss", miss, True),
                                   ("tree_hit", hit, True)):
        drafter = NgramDrafter(cache, max_draft_tokens=8, use_tree=use_tree,
                               tokenizer=tokenizer)
        req = SimpleNamespace(uid=1, input_ids=prompt, output_ids=[],
                              params=SimpleNamespace(max_new_tokens=10 * steps))
        t0 = time.perf_counter()
        drafter.propose(req, 8)
        out[f"{label}_first_call_ms"] = 1e3 * (time.perf_counter() - t0)
        drafted = 0
        t0 = time.perf_counter()
        for tok in future:
            req.output_ids.append(tok)
            draft = drafter.propose(req, 8)
            drafter.observe(req, len(draft), len(draft))
            drafted += bool(draft)
        out[f"{label}_us_per_call"] = 1e6 * (time.perf_counter() - t0) / steps
        out[f"{label}_draft_fraction"] = drafted / steps
    return out


# ---------------------------------------------------------------- online rounds
def speculative_engine(kwargs: dict):
    """The engine with speculation on, or (None, why) where the option does not exist."""
    from radixlm.runtime.engine import Engine

    try:
        return Engine(log_level="warning", speculative_algorithm="NGRAM", **kwargs), None
    except ValueError as e:
        if "speculative_algorithm" not in str(e):
            raise
        return None, (f"speculation on: not available in this build ({e}); the on side is "
                      "skipped, the off side, llama.cpp and the offline replay still run")


def decode_rate(runs: list[dict]) -> float:
    """Decode tokens per second over runs (first token excluded: it is the prefill's)."""
    tokens = sum(max(len(r["ids"]) - 1, 0) for r in runs)
    seconds = sum(r["total"] - r["ttft"] for r in runs)
    return tokens / seconds if seconds > 0 else float("nan")


def single_round(systems: dict, cases: list[Case], new: int, rnd: int) -> dict:
    """One round: every case on every system, the order rotated by round."""
    names = list(systems)
    runs: dict[str, dict[str, list[dict]]] = {n: {} for n in names}
    for i, case in enumerate(cases):
        k = (rnd + i) % len(names)
        for name in names[k:] + names[:k]:
            runs[name].setdefault(case.task, []).append(systems[name](case, new))
    return runs


def batch_round(engines: dict, prompts: dict[int, list[Case]], new: int) -> dict:
    out: dict[str, dict] = {}
    for size, cases in prompts.items():
        out[str(size)] = {}
        for name, engine in engines.items():
            params = [{"max_new_tokens": new, "temperature": 0,
                       **({"json_schema": json.dumps(c.schema)} if c.schema else {})}
                      for c in cases]
            engine.flush_cache()
            t0 = time.perf_counter()
            res = engine.generate(input_ids=[c.ids for c in cases], sampling_params=params)
            wall = time.perf_counter() - t0
            tokens = sum(r["meta_info"]["completion_tokens"] for r in res)
            out[str(size)][name] = {"tok_s": tokens / wall, "ids": [r["output_ids"]
                                                                     for r in res]}
    return out


def batch_cases(tokenizer, size: int) -> list[Case]:
    per = -(-size // len(TASKS))
    mixed = [build_prompts(t, per, seed=100 + size) for t in TASKS]
    picked = [p for group in zip(*mixed, strict=True) for p in group][:size]
    return [Case(p.task, p.name, chat_ids(tokenizer, p.messages if p.task != "agent"
                                          else agent_turn(p, [])), p.json_schema)
            for p in picked]


# ---------------------------------------------------------------- report
def ratios(rounds: list[dict], a: str, b: str) -> dict:
    """Per task: per-round ratio of decode tok/s ``a / b`` and the median."""
    out = {}
    if a not in rounds[0] or b not in rounds[0]:
        return out
    for task in rounds[0][a]:
        per = [decode_rate(r[a][task]) / decode_rate(r[b][task]) for r in rounds]
        out[task] = {"median": statistics.median(per), "rounds": per}
    return out


def identity(rounds: list[dict], cases: list[Case], a: str, b: str) -> dict:
    """Per prompt: whether ``a`` and ``b`` produced the same token ids in every round."""
    if a not in rounds[0] or b not in rounds[0]:
        return {}
    same: dict[str, bool] = {}
    for r in rounds:
        for task, runs_a in r[a].items():
            names = [c.name for c in cases if c.task == task]
            for name, ra, rb in zip(names, runs_a, r[b][task], strict=True):
                same[name] = same.get(name, True) and ra["ids"] == rb["ids"]
    return same


def print_tables(results: dict) -> None:
    print(f"\n{results['host_line']}")
    print("\noffline replay of the drafter over greedy outputs (speculation off)")
    print(f"{'task':<9}{'prompts':>8}{'tokens':>8}{'draft%':>8}{'tok/step':>9}"
          f"{'acc/draft':>10}{'acc rate':>9}{'est x':>7}{'target':>7}{'us/call':>8}")
    for task, s in results["offline"].items():
        target = f"{TARGETS[task]:.2f}" if task in TARGETS else "-"
        print(f"{task:<9}{s['prompts']:>8}{s['tokens']:>8}{100 * s['draft_step_fraction']:>7.0f}%"
              f"{s['accept_length']:>9.2f}{s['accepted_per_draft']:>10.2f}"
              f"{s['accept_rate']:>9.2f}{s['est_speedup']:>7.2f}{target:>7}"
              f"{s['propose_us']:>8.1f}")
    print("(tokens: decoded, jump-forward's forced ones left out; draft%: steps with a draft; "
          "tok/step: accept length; us/call: the drafter's time per call, the first call's "
          "indexing of the prompt included)")
    costs = sorted((int(j), c) for j, c in results["step_costs"]["relative"].items())
    print(f"step cost relative to a 1-token step ({results['step_costs'].get('method')}): "
          + ", ".join(f"{j} tok {c:.2f}" for j, c in costs))
    print("drafter cost: " + ", ".join(f"{k} {v:.1f}" for k, v in results["drafter_cost"].items()))
    for note in results["notes"]:
        print(f"note: {note}")
    single = results.get("single_stream", {})
    if single:
        print("\nsingle stream, decode tok/s (median over rounds) and ratios (per round)")
        print(f"{'task':<9}" + "".join(f"{n:>12}" for n in single["rates"]))
        for task in single["rates"].get("off", {}):
            print(f"{task:<9}" + "".join(f"{single['rates'][n][task]:>12.1f}"
                                         for n in single["rates"]))
        for label, table in single["ratios"].items():
            for task, r in table.items():
                per = " ".join(f"{x:.2f}" for x in r["rounds"])
                print(f"  {label:<22}{task:<9}{r['median']:>6.2f}  ({per})")
        for label, same in single["identity"].items():
            bad = [n for n, ok in same.items() if not ok]
            print(f"  identical greedy ids {label}: {len(same) - len(bad)}/{len(same)}"
                  + (f"; differ: {', '.join(bad)}" if bad else ""))
    for size, res in results.get("batch", {}).items():
        per = {n: " ".join(f"{x:.1f}" for x in v) for n, v in res["tok_s_rounds"].items()}
        print(f"\nbatch {size}: tok/s per round " + "; ".join(f"{n}: {v}" for n, v in per.items())
              + (f"; on/off median {res['ratio_median']:.2f}" if "ratio_median" in res else ""))


def single_stream(systems: dict, cases: list[Case], args) -> dict:
    rounds = []
    for rnd in range(args.rounds):
        runs = single_round(systems, cases, args.new_tokens, rnd)
        rounds.append(runs)
        print(json.dumps({"round": rnd, "decode_tok_s": {
            n: {t: round(decode_rate(v), 2) for t, v in per.items()}
            for n, per in runs.items()}}), flush=True)
    rates = {n: {t: statistics.median(decode_rate(r[n][t]) for r in rounds)
                 for t in rounds[0][n]} for n in systems}
    pairs = {"on/off": ("on", "off"), "llama_pld/llama": ("llama_pld", "llama"),
             "on/llama_pld": ("on", "llama_pld"), "off/llama": ("off", "llama")}
    return {"rates": rates,
            "ratios": {k: v for k, (a, b) in pairs.items() if (v := ratios(rounds, a, b))},
            "identity": {k: v for k, (a, b) in (("on vs off", ("on", "off")),
                                                ("llama_pld vs llama", ("llama_pld", "llama")))
                         if (v := identity(rounds, cases, a, b))}}


def batches(engines: dict, tokenizer, sizes: list[int], args) -> dict:
    prompts = {b: batch_cases(tokenizer, b) for b in sizes}
    rounds = []
    for rnd in range(args.rounds):
        order = dict(list(engines.items())[rnd % len(engines):]
                     + list(engines.items())[:rnd % len(engines)])
        rounds.append(batch_round(order, prompts, args.batch_new_tokens))
        print(json.dumps({"batch_round": rnd, "tok_s": {
            b: {n: round(v["tok_s"], 1) for n, v in r.items()}
            for b, r in rounds[-1].items()}}), flush=True)
    out = {}
    for b in prompts:
        res = {"tok_s_rounds": {n: [r[str(b)][n]["tok_s"] for r in rounds] for n in engines}}
        if "on" in engines:
            per = [r[str(b)]["on"]["tok_s"] / r[str(b)]["off"]["tok_s"] for r in rounds]
            res["ratio_rounds"], res["ratio_median"] = per, statistics.median(per)
            res["identical_prompts"] = sum(
                all(r[str(b)]["on"]["ids"][i] == r[str(b)]["off"]["ids"][i] for r in rounds)
                for i in range(b))
        out[str(b)] = res
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="llama.cpp's n_threads (default: every core, as radixlm); on an "
                         "oversubscribed host 1 avoids its spin barriers collapsing")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per task (agent: loops)")
    ap.add_argument("--tasks", default=",".join(TASKS),
                    help=f"comma-separated subset of {','.join(TASKS)} (single stream)")
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--batch-new-tokens", type=int, default=96)
    ap.add_argument("--batches", default="16,64", help="batch sizes ('' for none)")
    ap.add_argument("--max-draft", type=int, default=8, help="drafter max_draft_tokens")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-online", action="store_true", help="outputs and replay only")
    ap.add_argument("--llama-python", default=None,
                    help="interpreter with llama_cpp (default .venv-llamacpp/bin/python)")
    ap.add_argument("--llama-num-pred", type=int, default=10,
                    help="LlamaPromptLookupDecoding(num_pred_tokens=...)")
    add_extra_bufts_arg(ap)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round, 1 prompt per task, 32 tokens, no batches")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.llama_extra_bufts = extra_bufts_on(args.llama_extra_bufts)
    if args.worker:
        worker(args.worker, args.threads, args.llama_extra_bufts, args.llama_num_pred)
        return
    if args.quick:
        args.rounds, args.prompts, args.new_tokens, args.batches = 1, 1, 32, ""
    if args.rounds < 1 or args.prompts < 1:
        ap.error("--rounds and --prompts must be at least 1")
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    if not tasks or any(t not in TASKS for t in tasks):
        ap.error(f"--tasks takes names from {', '.join(TASKS)}, got {args.tasks!r}")

    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.weights import gguf_source

    host = host_info()
    print(host_line(host), flush=True)
    off = Engine(log_level="warning", speculative_algorithm="none")  # (the default is on)
    results: dict = {"host": host, "host_line": host_line(host), "notes": [],
                     "args": vars(args)}
    cases = build_cases(off, tasks, args.prompts, args.new_tokens)
    longest = max(cases, key=lambda c: len(c.ids))
    results["step_costs"] = step_costs(off, longest.ids, repeats=1 if args.quick else 3)
    results["offline"] = replay_tasks(cases, results["step_costs"]["relative"],
                                      args.max_draft, {"tokenizer": off.tokenizer})
    results["drafter_cost"] = drafter_cost(off.tokenizer)
    print(json.dumps({"offline": results["offline"], "drafter_cost": results["drafter_cost"]}),
          flush=True)
    if not args.skip_online:
        online(results, off, cases, args, str(gguf_source(off.model_path)))
    off.shutdown()
    print(json.dumps(results, indent=2, default=str))
    print_tables(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))


def online(results: dict, off, cases: list[Case], args, gguf: str) -> None:
    on, why = speculative_engine({})
    if why:
        print(f"note: {why}", flush=True)
        results["notes"].append(why)
    systems = {"off": lambda c, n: run_radixlm(off, c, n)}
    if on is not None:
        systems["on"] = lambda c, n: run_radixlm(on, c, n)
    llama = None
    python = args.llama_python or str(ROOT / ".venv-llamacpp" / "bin" / "python")
    python = python if Path(python).exists() else sys.executable
    if not args.skip_llama and subprocess.run([python, "-c", "import llama_cpp"],
                                              capture_output=True).returncode:
        why = (f"llama.cpp: {python} cannot import llama_cpp (make bench-llamacpp, or "
               "--llama-python): skipped")
        print(f"note: {why}", flush=True)
        results["notes"].append(why)
    elif not args.skip_llama:
        llama = LlamaCpp(python, gguf, args.threads, args.llama_extra_bufts,
                         args.llama_num_pred)
        stop = sorted(off.eos_ids)
        systems["llama"] = lambda c, n: llama.run("plain", c, n, stop)
        systems["llama_pld"] = lambda c, n: llama.run("lookup", c, n, stop)
        results["llama_cpp"] = {"version": llama.version, "features": llama.features,
                                "num_pred_tokens": args.llama_num_pred,
                                "extra_bufts": args.llama_extra_bufts}
    for run in systems.values():  # warm-up
        run(cases[0], 8)
    results["single_stream"] = single_stream(systems, cases, args)
    if llama is not None:
        llama.close()
    sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    if sizes:
        engines = {"off": off, **({"on": on} if on is not None else {})}
        results["batch"] = batches(engines, off.tokenizer, sizes, args)
    if on is not None:
        on.shutdown()


if __name__ == "__main__":
    main()
