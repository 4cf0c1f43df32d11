"""int8 K/V (``--kv-cache-dtype int8``) against the unquantized pool: capacity at the same
memory, batch decode step throughput, and logprobs on the reference prompts.

    .venv/bin/python benchmarks/bench_kv_cache.py [--batch 64] [--contexts 256,1024]
        [--steps 20] [--rounds 5] [--mem-mb 1024] [--out FILE]

* capacity: tokens the pool sizing gives for ``--mem-mb`` of memory in each format, for the
  default model's shape and dtype on this host (and the bytes the buffers then take);
* decode: two engines on the same weights (``kv_cache_dtype`` auto and int8, the host's
  default dtype and native path), one synthetic decode step of ``--batch`` requests after
  each context (distinct slots, random K/V written through the pool in its format), timed
  alternately round by round; the per-round ratio int8 / auto of tokens per second, and
  where the library has stage timers, the attention stage (K/V store + attention) alone;
* logprobs: the reference prompts of tests/test_engine_reference.py, 16 greedy tokens each:
  mean |delta logprob| of the int8 pool's prompt and continuation tokens against the
  unquantized pool scoring the same tokens, and how many greedy texts are equal.
"""

from __future__ import annotations

# radixlm before torch (it bounds OpenMP's spin-wait, which libgomp reads once)
import radixlm  # noqa: F401  # isort: skip

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_decode_step import decode_batch, fill_table

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("auto", "int8")


def capacity(mem_mb: int) -> dict:
    """Pool tokens per format for ``mem_mb`` MB (the sizing of ModelRunner._pool_capacity)
    and the bytes the buffers take at that size."""
    from radixlm.runtime.config import EngineConfig
    from radixlm.runtime.device import pick_device_dtype
    from radixlm.runtime.kv_pool import KVPool
    from radixlm.runtime.models.shape import ModelConfig
    from radixlm.runtime.weights import load_hf_config, resolve_model

    cfg = ModelConfig.from_hf(load_hf_config(resolve_model("smollm2-135m-instruct")))
    _, dtype = pick_device_dtype(EngineConfig())
    out = {"dtype": str(dtype).removeprefix("torch."), "mem_mb": mem_mb}
    for kv in FORMATS:
        per_token = KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                           dtype, kv)
        tokens = (mem_mb << 20) // per_token
        pool = KVPool(tokens, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype,
                      torch.device("cpu"), 2, 8, kv_cache_dtype=kv)
        out[kv] = {"bytes_per_token": per_token, "tokens": tokens, "pool_bytes": pool.nbytes}
        del pool
    out["ratio"] = out["int8"]["tokens"] / out["auto"]["tokens"]
    return out


def fill_kv(runner, batch: int, context: int) -> None:
    """Random unit-scale K/V in every slot the decode batch reads, stored in the pool's
    format (int8: quantized), so both formats time real numbers."""
    gen = torch.Generator().manual_seed(0)
    pool = runner.pool
    slots = runner.pool.req_to_token[:batch, :context + 1].reshape(-1).long()
    shape = (slots.numel(), *pool.k_buffer[0].shape[1:])
    for layer in range(len(pool.k_buffer)):
        k, v = (torch.randn(shape, generator=gen).to(pool.dtype) for _ in range(2))
        pool.store(layer, slots, k, v)


def time_steps(native, fb, steps: int, lib_prof=None) -> dict:
    """ms per decode step (and, with the profiling build, the attention stages' ms)."""
    lib_main = native.lib
    if lib_prof is not None:
        native.lib = lib_prof
    try:
        for _ in range(2):
            native.forward(fb)
        if lib_prof is not None:
            lib_prof.rlm_profile(None, 1)
        t0 = time.perf_counter()
        for _ in range(steps):
            native.forward(fb)
        step_ms = (time.perf_counter() - t0) / steps * 1e3
        out = {"step_ms": step_ms, "tok_s": fb.num_tokens / step_ms * 1e3}
        if lib_prof is not None:
            stages = (ctypes.c_double * 16)()
            lib_prof.rlm_profile(stages, 1)
            out["attention_ms"] = (stages[2] + stages[3]) / steps * 1e3
    finally:
        native.lib = lib_main
    return out


def decode(engines: dict, batch: int, contexts: list[int], steps: int, rounds: int,
           lib_prof) -> dict:
    results = {}
    for context in contexts:
        fb = decode_batch(batch, context)
        for engine in engines.values():
            fill_table(engine.runner, batch, context)
            fill_kv(engine.runner, batch, context)
        runs = {kv: [] for kv in engines}
        for _ in range(rounds):  # alternate the formats round by round (a shared host)
            for kv, engine in engines.items():
                runs[kv].append(time_steps(engine.runner.native, fb, steps, lib_prof))
        ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(runs["auto"], runs["int8"])]
        results[context] = {
            **{kv: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for kv, rs in runs.items()},
            "round_ratios": ratios, "ratio_median": statistics.median(ratios)}
    return results


def logprobs(engines: dict) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_engine_reference import NEW_TOKENS, PROMPTS

    base, quant = engines["auto"], engines["int8"]
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
    ours = quant.generate(PROMPTS, params, return_logprob=True, logprob_start_len=0)
    theirs = base.generate(PROMPTS, params, return_logprob=True, logprob_start_len=0)
    ids = [quant.tokenizer.encode(p, add_special_tokens=False) + o["output_ids"]
           for p, o in zip(PROMPTS, ours)]
    scored = base.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                           return_logprob=True, logprob_start_len=0)
    prompt_d, decode_d = [], []
    for a, b, s in zip(ours, theirs, scored):
        n = a["meta_info"]["prompt_tokens"]
        lp = [x[0] for x in a["meta_info"]["input_token_logprobs"][1:]]
        prompt_d += list(np.abs(np.subtract(lp, [x[0] for x in
                                                 b["meta_info"]["input_token_logprobs"][1:]])))
        decode_d += list(np.abs(np.subtract(
            [x[0] for x in a["meta_info"]["output_token_logprobs"]],
            [x[0] for x in s["meta_info"]["input_token_logprobs"][n:]])))
    return {"prompts": len(PROMPTS), "prompt_mean_abs": float(np.mean(prompt_d)),
            "decode_mean_abs": float(np.mean(decode_d)),
            "all_mean_abs": float(np.mean(prompt_d + decode_d)),
            "max_abs": float(max(prompt_d + decode_d)),
            "greedy_equal": sum(a["output_ids"] == b["output_ids"]
                                for a, b in zip(ours, theirs))}


def print_table(results: dict) -> None:
    cap = results["capacity"]
    print(f"\ncapacity at {cap['mem_mb']} MB ({cap['dtype']} model): auto "
          f"{cap['auto']['tokens']} tokens ({cap['auto']['bytes_per_token']} B/token), int8 "
          f"{cap['int8']['tokens']} tokens ({cap['int8']['bytes_per_token']} B/token): "
          f"{cap['ratio']:.2f}x")
    print(f"\ndecode, batch {results['batch']} (medians of {results['rounds']} alternating "
          "rounds; ratio int8 / auto tokens per second)")
    print(f"{'context':>8}{'auto ms':>10}{'int8 ms':>10}{'auto attn':>11}{'int8 attn':>11}"
          f"{'ratio':>8}  per round")
    for context, r in results["decode"].items():
        attn = [f"{r[kv].get('attention_ms', float('nan')):>11.2f}" for kv in FORMATS]
        print(f"{context:>8}{r['auto']['step_ms']:>10.2f}{r['int8']['step_ms']:>10.2f}"
              f"{attn[0]}{attn[1]}{r['ratio_median']:>8.3f}  "
              + " ".join(f"{x:.3f}" for x in r["round_ratios"]))
    lp = results["logprobs"]
    print(f"\nlogprobs on {lp['prompts']} reference prompts: mean |delta| prompt "
          f"{lp['prompt_mean_abs']:.4f}, continuation {lp['decode_mean_abs']:.4f}, all "
          f"{lp['all_mean_abs']:.4f} (max {lp['max_abs']:.3f}); greedy text equal "
          f"{lp['greedy_equal']}/{lp['prompts']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mem-mb", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from radixlm.native import build
    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    host = host_info()
    print(host_line(host), flush=True)
    contexts = [int(x) for x in args.contexts.split(",")]
    tokens = args.batch * (max(contexts) + 2) + 64
    engines = {kv: Engine(log_level="warning", kv_cache_dtype=kv, max_total_tokens=tokens)
               for kv in FORMATS}
    if any(e.runner.native is None for e in engines.values()):
        raise SystemExit("the native library is unavailable on this host: nothing to time")
    try:
        lib_prof = build.load_variant(["-march=native", "-DRLM_PROFILE"])
    except RuntimeError:
        lib_prof = None
    results = {"host": host, "batch": args.batch, "rounds": args.rounds,
               "steps": args.steps, "capacity": capacity(args.mem_mb),
               "decode": decode(engines, args.batch, contexts, args.steps, args.rounds,
                                lib_prof),
               "logprobs": logprobs(engines)}
    for engine in engines.values():
        engine.shutdown()
    print(json.dumps(results, indent=2))
    print(f"\n{host_line(host)}")
    print_table(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
