"""Where a decode step's time goes: ms per step split into linears / attention / the rest,
for the reference torch path and the native path, at a few batch sizes.

    .venv/bin/python benchmarks/bench_decode_step.py [--batches 1,16,64] [--context 256]

The reference path is measured with torch.profiler (self CPU time per op, grouped: GEMMs and
weight-only matmuls = linears; SDPA, K/V stores and gathers = attention; the remaining ops;
what is left of the wall time is Python and dispatch). The native path is measured with a
profiling build of the library (stage timers at the barriers; the head counts as a linear).
Both run the same synthetic decode batch (one token per request after ``--context``
cached positions) on the same engine weights, alternating ``--rounds`` times.
"""

from __future__ import annotations

# radixlm before torch (it bounds OpenMP's spin-wait, which libgomp reads once, when
# torch loads it): with torch first, libgomp's ~300k-iteration spin after each torch op
# took a core from the native steps (an 8-token step measured 38 ms instead of 26).
import radixlm  # noqa: F401  # isort: skip

import argparse
import ctypes
import json
import statistics
import time

import torch

from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

LINEAR_OPS = ("aten::addmm", "aten::mm", "aten::_weight_int4pack_mm_for_cpu",
              "aten::_weight_int8pack_mm", "aten::bmm", "aten::linear")
ATTN_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_attention_math", "aten::scaled_dot_product_attention",
            "aten::index_put_", "aten::index", "aten::_unsafe_index_put", "aten::copy_")


def decode_batch(batch: int, context: int) -> ForwardBatch:
    def t(values):
        return torch.tensor(values, dtype=torch.int64)

    rows = list(range(batch))
    return ForwardBatch(
        ForwardMode.DECODE, t([17 + i for i in rows]), t([context] * batch),
        t([1 + i for i in rows]), t(rows), t([context + 1] * batch), t([context] * batch),
        t([1] * batch), t(rows), t(rows), [context + 1] * batch, [context] * batch, [1] * batch,
        [1000 + i for i in rows])


def fill_table(runner, batch: int, context: int) -> None:
    """Distinct pool slots for every cached position of every row (K/V content is whatever
    the pool holds: timing only)."""
    table = runner.pool.req_to_token
    base = 1 + batch
    for r in range(batch):
        table[r, :context + 1] = torch.arange(base + r * (context + 1),
                                              base + (r + 1) * (context + 1))


def profile_reference(runner, fb: ForwardBatch, steps: int) -> dict:
    model, attn = runner.model, runner.attn
    for _ in range(2):
        attn.init_forward_metadata(fb)
        model.forward(fb, attn)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            attn.init_forward_metadata(fb)
            model.forward(fb, attn)
        wall = (time.perf_counter() - t0) / steps
    lin = att = other = 0.0
    for ev in prof.key_averages():
        us = ev.self_cpu_time_total / steps / 1e3  # ms per step
        if ev.key in LINEAR_OPS:
            lin += us
        elif ev.key in ATTN_OPS:
            att += us
        else:
            other += us
    wall_ms = wall * 1e3
    return {"step_ms": wall_ms, "linears_ms": lin, "attention_ms": att,
            "rest_ms": max(wall_ms - lin - att, 0.0), "rest_ops_ms": other}


def profile_native(runner, lib_prof, fb: ForwardBatch, steps: int, modes=None) -> dict:
    """``modes``: the decoder's (small, large) activation modes for this run (None: its
    own, i.e. the engine's defaults)."""
    native = runner.native
    lib_main, modes_main = native.lib, native.act_modes
    native.lib = lib_prof
    native.act_modes = modes or modes_main
    try:
        for _ in range(2):
            native.forward(fb)
        lib_prof.rlm_profile(None, 1)
        t0 = time.perf_counter()
        for _ in range(steps):
            native.forward(fb)
        wall_ms = (time.perf_counter() - t0) / steps * 1e3
        stages = (ctypes.c_double * 16)()
        lib_prof.rlm_profile(stages, 1)
    finally:
        native.lib, native.act_modes = lib_main, modes_main
    ms = [s / steps * 1e3 for s in stages]
    lin = ms[1] + ms[4] + ms[6] + ms[8] + ms[9]
    att = ms[2] + ms[3]
    return {"step_ms": wall_ms, "linears_ms": lin, "attention_ms": att,
            "rest_ms": max(wall_ms - lin - att, 0.0), "rest_c_ms": ms[0] + ms[5] + ms[7]}


ACT_NAMES = {"int8": 0, "fp32": 1, "bf16": 2}  # csrc/rlm.h ACT_*


def make_engines(args):
    """The engine the native paths run on, and the reference one (None with
    ``--no-reference``): a host without the library runs it (torch int4 / bf16 or fp32)."""
    from radixlm.native import build
    from radixlm.runtime.engine import Engine

    biggest = max(int(b) for b in args.batches.split(","))
    kwargs = {"log_level": "warning", "dtype": args.dtype, "model": args.model,
              "max_total_tokens": max(40000, biggest * (args.context + 1)),
              "max_running_requests": max(64, biggest)}  # (a request table row a sequence)
    native_engine = Engine(**kwargs)
    settle(native_engine)
    if native_engine.runner.native is None:
        raise SystemExit("the native library is unavailable on this host: nothing to compare")
    if args.no_reference:
        return native_engine, None
    build.load.cache_clear()
    saved = build.load
    build.load = lambda: None
    try:
        ref_engine = Engine(**kwargs)
    finally:
        build.load = saved
    settle(ref_engine)
    return native_engine, ref_engine


def settle(engine) -> None:
    """Wait for what an engine makes on a thread after ready (the grammar backend, then
    llguidance's tokenizer tables: ~1 s of a core), which would otherwise share the first
    timed batch's cores (its step read 3-6x slower)."""
    backend = engine.grammar_backend
    if backend is not None and hasattr(backend, "ll_tokenizer"):
        try:
            _ = backend.ll_tokenizer
        except ValueError:
            pass  # (a tokenizer llguidance cannot read: nothing more is made)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="model alias, HF directory (dense rows natively) or .gguf")
    ap.add_argument("--dtype", default="auto", help="the engine's dtype (auto: the host's)")
    ap.add_argument("--activations", default="",
                    help="also time the native path with steps of these activation modes "
                         "(comma list of fp32 | int8 | bf16; every step size under one mode)")
    ap.add_argument("--no-reference", action="store_true", help="skip the torch path")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from radixlm.native import build
    from radixlm.native.build import host_info, host_line

    host = host_info()
    print(host_line(host), flush=True)
    native_engine, ref_engine = make_engines(args)
    lib_prof = build.load_variant(["-march=native", "-DRLM_PROFILE"]
                                  if build.envs.cpu_isa() == "native"
                                  else [*build._ARCH[build.envs.cpu_isa()], "-DRLM_PROFILE"])
    assert lib_prof.rlm_profile(None, 1) == 1
    native = native_engine.runner.native
    default_modes = native.act_modes
    modes = {"native": None}
    modes.update({f"native_{m}": ((1, ACT_NAMES[m]),)
                  for m in args.activations.split(",") if m})
    if native_engine.runner.native.arena.int8_only:  # (Q8 rows repacked for int8 steps)
        skipped = [p for p, m in modes.items() if m and any(a != ACT_NAMES["int8"] for _, a in m)]
        for p in skipped:
            print(f"{p}: skipped (this engine's Q8 rows are laid out for int8 steps only; "
                  f"start it with --dtype/activations in that mode to time it)")
            del modes[p]
    paths = (["reference"] if ref_engine else []) + list(modes)
    results = {"host": host, "context": args.context, "native_act_modes": default_modes,
               "weights": native_engine.runner.precision["weights"],
               **{p: {} for p in paths},
               "reference_path": (f"torch {ref_engine.runner.dtype}"
                                  + (" + int4 linears" if ref_engine.runner.int4 is not None
                                     else "")) if ref_engine else "not run"}
    for b in [int(x) for x in args.batches.split(",")]:
        fb = decode_batch(b, args.context)
        runs = {p: [] for p in paths}
        for _ in range(args.rounds):  # the paths alternate within each round
            if ref_engine:
                fill_table(ref_engine.runner, b, args.context)
                runs["reference"].append(profile_reference(ref_engine.runner, fb, args.steps))
            fill_table(native_engine.runner, b, args.context)
            for path, m in modes.items():
                runs[path].append(profile_native(native_engine.runner, lib_prof, fb,
                                                 args.steps, m))
        for path, rs in runs.items():
            results[path][b] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            results[path][b]["rounds_step_ms"] = [r["step_ms"] for r in rs]
        results["quiet_ratio_vs_native"] = results.get("quiet_ratio_vs_native", {})
        results["quiet_ratio_vs_native"][b] = quiet_ratios(results, paths, b)
    for engine in (ref_engine, native_engine):
        if engine:
            engine.shutdown()
    report(results, args, paths, default_modes, host)


def quiet_ratios(results, paths, b) -> dict:
    """Each path's step time over the default native path's, per round (the paths of a
    round run back to back), median over the quietest quarter of the rounds (the least
    total time): on a shared host the other rounds measure the neighbours."""
    rounds = list(zip(*(results[p][b]["rounds_step_ms"] for p in paths)))
    quiet = sorted(rounds, key=sum)[:max(1, len(rounds) // 4)]
    base = paths.index("native")
    return {p: statistics.median(r[i] / r[base] for r in quiet) for i, p in enumerate(paths)}


def report(results, args, paths, default_modes, host) -> None:
    from radixlm.native.build import host_line

    print(json.dumps(results, indent=2))
    print(f"\n{host_line(host)}; context {args.context}; weights {results['weights']}; "
          f"reference = {results['reference_path']}; native = its defaults (activation "
          f"modes {default_modes}: (from tokens, mode), 0 int8, 1 fp32, 2 bf16); "
          "native_MODE: every step MODE")
    print(f"{'batch':>5} {'path':<12}{'step ms':>9}{'min':>8}{'quiet x':>8}{'linears':>9}"
          f"{'attention':>11}{'rest':>8}  rounds (medians; min: the quietest round; quiet x: "
          "over native, the quietest quarter of rounds)")
    for b in results[paths[-1]]:
        for path in paths:
            r = results[path][b]
            per = " ".join(f"{x:.2f}" for x in r["rounds_step_ms"])
            print(f"{b:>5} {path:<12}{r['step_ms']:>9.2f}{min(r['rounds_step_ms']):>8.2f}"
                  f"{results['quiet_ratio_vs_native'][b][path]:>8.3f}"
                  f"{r['linears_ms']:>9.2f}{r['attention_ms']:>11.2f}{r['rest_ms']:>8.2f}  {per}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
