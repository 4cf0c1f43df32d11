"""Offline throughput and latency of the engine vs HF transformers ``generate``.

    .venv/bin/python benchmarks/bench_offline.py [--quick] [--skip-hf] [--rounds N]
                        [--batches 16,64] [--out results.json]

Same prompts for every system in one run. Reports single-stream decode tok/s, prefill
tok/s, batch throughput at each batch size with equal and with mixed output lengths
(continuous batching vs HF's static batch), TTFT/TPOT p50/p99, with HF transformers
``generate`` at its best dtype on this host (bf16 where the CPU has native bf16, else fp32)
as the baseline. Prints the host (CPU, cores, ISA flags) first.
"""

from __future__ import annotations

# radixlm before torch (it bounds OpenMP's spin-wait, which libgomp reads once, when
# torch loads it): with torch first, libgomp's ~300k-iteration spin after each torch op
# took a core from the native steps (an 8-token step measured 38 ms instead of 26).
import radixlm  # noqa: F401  # isort: skip

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

WORDS = ("the of and to in is was for on that with as by at from his her an were are which "
         "this be or had not but what all when there can who been one more time city river "
         "water music history science garden market winter summer story people world").split()


def make_prompt(rng: random.Random, tokenizer, n_tokens: int) -> list[int]:
    text = " ".join(rng.choice(WORDS) for _ in range(n_tokens * 2))
    return tokenizer.encode(text, add_special_tokens=False)[:n_tokens]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


def bench_engine(engine, batches, single_ids, single_new, prefill_prompts) -> dict:
    res = {}
    engine.generate(input_ids=single_ids, sampling_params={"max_new_tokens": 8,
                                                           "temperature": 0})  # warm-up
    engine.flush_cache()
    t = time.perf_counter()
    out = engine.generate(input_ids=single_ids, sampling_params={
        "max_new_tokens": single_new, "temperature": 0, "ignore_eos": True})
    e2e = time.perf_counter() - t
    ttft = out["meta_info"]["ttft"]
    res["single_decode_tok_s"] = (single_new - 1) / (e2e - ttft)
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=prefill_prompts, sampling_params={"max_new_tokens": 1,
                                                                "temperature": 0})
    res["prefill_tok_s"] = sum(map(len, prefill_prompts)) / (time.perf_counter() - t)
    for name, (prompts, out_lens) in batches.items():
        engine.flush_cache()
        params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
                  for n in out_lens]
        t = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        wall = time.perf_counter() - t
        toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
        ttfts = [o["meta_info"]["ttft"] for o in outs]
        tpots = [(o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"])
                 / max(o["meta_info"]["completion_tokens"] - 1, 1) for o in outs]
        res.update({f"{name}_tok_s": toks / wall, f"{name}_ttft_p50_s": pct(ttfts, 0.5),
                    f"{name}_ttft_p99_s": pct(ttfts, 0.99),
                    f"{name}_tpot_p50_s": pct(tpots, 0.5),
                    f"{name}_tpot_p99_s": pct(tpots, 0.99)})
    return res


def hf_best_dtype() -> torch.dtype:
    """HF's fastest dtype on this host: bf16 only where the CPU has it natively (elsewhere
    torch emulates bf16 and fp32 is faster)."""
    from radixlm.runtime.device import cpu_has_native_bf16

    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def load_hf(model_path):
    """The same model in transformers: a Hugging Face directory as it is, a GGUF file
    through transformers' GGUF reader (its weights dequantized to the dtype)."""
    from transformers import AutoModelForCausalLM

    path = Path(model_path)
    where = {"gguf_file": path.name} if path.is_file() else {}
    return AutoModelForCausalLM.from_pretrained(str(path.parent if where else path),
                                                dtype=hf_best_dtype(), **where).eval()


def bench_hf(model, batches, single_ids, single_new, prefill_prompts) -> dict:
    res = {}
    with torch.inference_mode():
        ids = torch.tensor([single_ids])
        model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2)
        t = time.perf_counter()
        model(ids)
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=single_new,
                       min_new_tokens=single_new, do_sample=False, pad_token_id=2)
        res["single_decode_tok_s"] = (single_new - 1) / (time.perf_counter() - t - ttft)
        t = time.perf_counter()
        for p in prefill_prompts:
            model(torch.tensor([p]))
        res["prefill_tok_s"] = sum(map(len, prefill_prompts)) / (time.perf_counter() - t)
        for name, (prompts, out_lens) in batches.items():
            width = max(map(len, prompts))
            batch = torch.full((len(prompts), width), 2)
            mask = torch.zeros_like(batch)
            for i, p in enumerate(prompts):  # left padding
                batch[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            t = time.perf_counter()
            model.generate(batch, attention_mask=mask, max_new_tokens=max(out_lens),
                           min_new_tokens=max(out_lens), do_sample=False, pad_token_id=2)
            # useful tokens of a static batch
            res[f"{name}_tok_s"] = sum(out_lens) / (time.perf_counter() - t)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batches", default="16,64", help="comma-separated batch sizes")
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two systems")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    host = host_info()
    print(host_line(host), flush=True)
    rng = random.Random(0)
    engine = Engine(args.model, attention_backend=args.attention_backend, log_level="warning")
    tok = engine.tokenizer
    batches = {}
    for size in ([4] if args.quick else [int(b) for b in args.batches.split(",")]):
        prompts = [make_prompt(rng, tok, rng.randint(64, 256)) for _ in range(size)]
        batches[f"batch{size}_equal"] = (prompts, [32 if args.quick else 64] * size)
        batches[f"batch{size}_mixed"] = (prompts, [rng.randint(16, 64 if args.quick else 128)
                                                   for _ in range(size)])
    single_ids = make_prompt(rng, tok, 64)
    single_new = 32 if args.quick else 128
    prefill_prompts = [make_prompt(rng, tok, 512) for _ in range(2 if args.quick else 8)]
    results = {"host": host,
               "config": {"batches": list(batches), "single_new_tokens": single_new,
                          "dtype": str(engine.runner.dtype),
                          "native": engine.runner.native is not None,
                          "hf_dtype": str(hf_best_dtype()),
                          "attention_backend": engine.runner.attention_backend_name}}
    model_dir = engine.model_path
    hf_model = None if args.skip_hf else load_hf(model_dir)
    # Rounds alternate the two systems, so slow phases of a shared VM hit both alike; each
    # metric is the median over rounds, each speedup the median of per-round ratios.
    rounds: list[dict] = []
    for _ in range(args.rounds):
        r = {"radixlm": bench_engine(engine, batches, single_ids, single_new, prefill_prompts)}
        if hf_model is not None:
            r["hf_transformers"] = bench_hf(hf_model, batches, single_ids, single_new,
                                            prefill_prompts)
        rounds.append(r)
    engine.shutdown()
    for system in rounds[0]:
        results[system] = {k: statistics.median(r[system][k] for r in rounds)
                           for k in rounds[0][system]}
    keys = ["single_decode_tok_s", "prefill_tok_s"] + [f"{b}_tok_s" for b in batches]
    if hf_model is not None:
        results["speedup"] = {k: statistics.median(r["radixlm"][k] / r["hf_transformers"][k]
                                                   for r in rounds) for k in keys}
        results["speedup_per_round"] = [{k: r["radixlm"][k] / r["hf_transformers"][k]
                                         for k in keys} for r in rounds]
    print(json.dumps(results, indent=2))
    print(f"\n{host_line(host)}; HF dtype {hf_best_dtype()}")
    print(f"{'metric':<28}{'radixlm':>12}{'hf':>12}{'speedup':>10}  per round")
    for k in keys:
        hf = results.get("hf_transformers", {}).get(k, float("nan"))
        ratio = results.get("speedup", {}).get(k, float("nan"))
        per = " ".join(f"{r[k]:.2f}" for r in results.get("speedup_per_round", []))
        print(f"{k:<28}{results['radixlm'][k]:>12.1f}{hf:>12.1f}{ratio:>10.2f}  {per}")
    for b in batches:
        for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
            print(f"{b + '_' + k:<28}{results['radixlm'][f'{b}_{k}']:>12.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
