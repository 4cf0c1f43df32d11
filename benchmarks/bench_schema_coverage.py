"""JSON-schema coverage, soundness and speed of the grammar backends on the JSONSchemaBench
sample (shared/data), side by side.

Per backend: schemas compiled, silent violations (a schema-invalid test instance accepted or
a random walk that fails ``jsonschema``, format checker on), valid instances accepted,
compile time p50/p99 (wall clock, and CPU time of the process, which a loaded machine does not
inflate) and mask time per token p50/p99 (the walks' mask fills). llguidance is
measured through its real token matcher on SmolLM2's tokenizer. outlines is checked on the
byte-level index of its regex (same language; compile time = translate + byte index) unless
``--token-index``, which builds the real token index (budgets on; p99 in the tens of
seconds) and times its masks too. See ``constraint_conformance.py``.

    .venv/bin/python benchmarks/bench_schema_coverage.py [--backends llguidance,outlines]
        [--token-index] [--walks 2] [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

from constraint_conformance import check_row, llguidance_checker, outlines_checker

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(results: list[dict]) -> dict:
    comp = [r for r in results if r["compiled"]]
    times = [r["compile_s"] for r in comp]
    cpu = [r["compile_cpu_s"] for r in comp]
    masks = [t for r in comp for t in r.get("mask_times", [])]
    return {
        "schemas": len(results), "compiled": len(comp),
        "compiled_pct": round(100 * len(comp) / max(1, len(results)), 1),
        "silent_violations": sum(r.get("violations", 0) for r in comp),
        "valid_accepted": sum(r.get("valid_accepted", 0) for r in comp),
        "valid": sum(r.get("valid", 0) for r in comp),
        "invalid_rejected": sum(r.get("invalid_rejected", 0) for r in comp),
        "invalid": sum(r.get("invalid", 0) for r in comp),
        "walks": sum(r.get("walks", 0) for r in comp),
        "compile_p50_ms": round(1e3 * pct(times, 0.5), 2),
        "compile_p99_ms": round(1e3 * pct(times, 0.99), 2),
        "compile_cpu_p50_ms": round(1e3 * pct(cpu, 0.5), 2),
        "compile_cpu_p99_ms": round(1e3 * pct(cpu, 0.99), 2),
        "mask_p50_us": round(1e6 * pct(masks, 0.5), 1) if masks else None,
        "mask_p99_us": round(1e6 * pct(masks, 0.99), 1) if masks else None,
        "mask_samples": len(masks),
        "rejected": dict(collections.Counter(r["reason"] for r in results
                                             if not r["compiled"]).most_common(8)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--backends", default="llguidance,outlines")
    ap.add_argument("--token-index", action="store_true",
                    help="outlines: build the real token index (slow) instead of byte-level")
    ap.add_argument("--walks", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.data.open()]
    rows = rows[: args.limit] if args.limit else rows
    from radixlm.constraints import create_grammar_backend
    from radixlm.runtime.weights import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("smollm2-135m-instruct"))
    from radixlm.native.build import host_info, host_line

    out: dict = {"host": host_info(), "data": str(args.data), "walks": args.walks}
    all_results = {}
    for name in args.backends.split(","):
        be = None
        if name == "llguidance" or args.token_index:
            extra = {"disk_cache": False, "memory_cache_size": 1} if name == "outlines" else {}
            be = create_grammar_backend(tok, len(tok), [tok.eos_token_id], backend=name,
                                        max_workers=1, **extra)
        if name == "outlines" and not args.token_index:
            make = outlines_checker
        else:
            make = (lambda b: lambda s: llguidance_checker(b, s))(be)  # token-level matcher
        t0 = time.perf_counter()
        results = [check_row(r, make, args.walks) for r in rows]
        summary = summarize(results)
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        summary["measured_on"] = ("byte-level index" if name == "outlines"
                                  and not args.token_index else "token matcher")
        out[name] = summary
        all_results[name] = results
        if be is not None:
            be.shutdown()
        for r in results:
            for kind, ex in r.get("violation_examples", []):
                print("VIOLATION", name, r["id"], kind, ex, file=sys.stderr)
    print(json.dumps(out, indent=1))
    print(f"\n{host_line(out['host'])}")
    print(f"{'backend':<12}{'compiled':>10}{'viol':>6}{'valid acc':>12}{'inval rej':>12}"
          f"{'cmp p50 ms':>12}{'cmp p99 ms':>12}{'cpu p99 ms':>12}{'mask p50 us':>13}"
          f"{'mask p99 us':>13}")
    for name in args.backends.split(","):
        s = out[name]
        print(f"{name:<12}{s['compiled']:>5}/{s['schemas']:<4}{s['silent_violations']:>6}"
              f"{s['valid_accepted']:>6}/{s['valid']:<5}{s['invalid_rejected']:>6}/"
              f"{s['invalid']:<5}{s['compile_p50_ms']:>12}{s['compile_p99_ms']:>12}"
              f"{s['compile_cpu_p99_ms']:>12}"
              f"{str(s['mask_p50_us']):>13}{str(s['mask_p99_us']):>13}  ({s['measured_on']})")
    if args.json:
        args.json.write_text(json.dumps({"summary": out, "results": all_results}, indent=1))
    return 1 if any(out[n]["silent_violations"] for n in args.backends.split(",")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
