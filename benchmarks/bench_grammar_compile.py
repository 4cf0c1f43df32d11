"""Grammar compile time of the llguidance backend on the JSONSchemaBench sample (shared/data),
cold and on the hit path of the compiled-grammar cache.

Per schema (the embedded SmolLM2 tokenizer, the server's JSON style unless
``--whitespace``), on one backend whose caches are emptied before every cold measurement:

- ``validate``: ``backend.validate(spec)`` (metaschema, keyword checks, ``prepare_schema``,
  llguidance's JSON compiler to a grammar) on the caller's thread;
- ``cold``: ``validate`` + ``backend.compile(spec)`` (matcher build on a compile worker,
  first mask, the regex-translator fallback where llguidance refuses the schema): what the
  first request with that schema waits;
- ``hit``: the same two calls again on an equal spec of its own text, as a later request
  brings (the validated-spec cache, then the compiled-grammar
  cache and a ``deep_copy`` of the template): what every later request waits.

With ``--rounds R`` each cold measurement is repeated R times and the median per schema is
kept (the hit path is timed 5 times per round, median). Where the time goes: ``meta_check``,
``prepare_schema`` and the rest of ``validate`` (JSON parse, keyword scan, llguidance's
``grammar_from_json_schema``), the matcher build (``LLMatcher`` + first mask) and the
translator fallback (``SchemaTranslator`` + its regex grammar; the refused llguidance build
before it counts as build), timed by wrappers around those functions.

    .venv/bin/python benchmarks/bench_grammar_compile.py [--limit N] [--rounds 3]
        [--whitespace '[ ]?'] [--json out.json]

Prints the host line first, JSON and a table at the end.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import statistics
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"
STAGES = ("meta_check", "prepare_schema", "translator")


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank quantile (as bench_schema_coverage.py)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def ms(x: float) -> float:
    return round(1e3 * x, 2)


class StageTimer:
    """Wall time per named stage of the current measurement (the compile worker runs one
    build at a time here: ``compile`` waits for it)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = collections.defaultdict(float)

    def reset(self) -> dict[str, float]:
        out, self.t = dict(self.t), collections.defaultdict(float)
        return out

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.t[name] += time.perf_counter() - t0
        return timed


def instrument(backend, timer: StageTimer) -> None:
    """Time the stages through wrappers: module functions the backend calls by name, and the
    backend's own build and translator methods (instance attributes shadow the class's)."""
    import radixlm.constraints.llguidance_backend as llb

    llb.meta_check = timer.wrap("meta_check", llb.meta_check)
    llb.prepare_schema = timer.wrap("prepare_schema", llb.prepare_schema)
    backend._build = timer.wrap("build_total", backend._build)
    backend._translated = timer.wrap("translator", backend._translated)


def make_cold(backend) -> None:
    """Empty the backend's caches (validated specs, compiled templates)."""
    from radixlm.constraints.cache import LRUCache

    backend._checked = LRUCache(256)
    backend._memory = LRUCache(256)


def reason_of(exc: Exception) -> str:
    """A refusal's llguidance reason (the translator's, which follows it, dropped) with its
    specifics (quoted names, numbers, $ref paths) blanked, so equal causes count together."""
    msg = str(exc).splitlines()[0].split(" (regex translation:")[0]
    msg = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", msg)
    msg = re.sub(r"json-schema:///\S*", "<ref>", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:140]


def measure(backend, timer: StageTimer, spec, rounds: int) -> dict:
    """Cold (median of ``rounds``) and hit timings of one spec, with the stage split of the
    median cold round."""
    colds = []
    for _ in range(rounds):
        make_cold(backend)
        timer.reset()
        t0 = time.perf_counter()
        try:
            backend.validate(spec)
            t1 = time.perf_counter()
            backend.compile(spec)
        except ValueError as exc:
            return {"compiled": False, "reason": reason_of(exc), "message": str(exc)[:300],
                    "refused_ms": ms(time.perf_counter() - t0)}
        t2 = time.perf_counter()
        colds.append({"cold_s": t2 - t0, "validate_s": t1 - t0, "compile_s": t2 - t1,
                      **timer.reset()})
    colds.sort(key=lambda c: c["cold_s"])
    med = colds[len(colds) // 2]
    hits, hit_compiles = [], []
    for _ in range(5 * rounds):
        again = dataclasses.replace(spec, value=spec.value.encode().decode())  # (its own text)
        t0 = time.perf_counter()
        backend.validate(again)
        t1 = time.perf_counter()
        backend.compile(again)
        t2 = time.perf_counter()
        hits.append(t2 - t0)
        hit_compiles.append(t2 - t1)
    build = med.get("build_total", 0.0) - med.get("translator", 0.0)
    validate_rest = med["validate_s"] - med.get("meta_check", 0.0) - med.get("prepare_schema", 0.0)
    return {
        "compiled": True, "cold_ms": ms(med["cold_s"]), "validate_ms": ms(med["validate_s"]),
        "compile_ms": ms(med["compile_s"]),
        "cold_rounds_ms": [ms(c["cold_s"]) for c in colds],
        "split_ms": {"meta_check": ms(med.get("meta_check", 0.0)),
                     "prepare_schema": ms(med.get("prepare_schema", 0.0)),
                     "validate_rest": ms(validate_rest),
                     "build": ms(build), "translator": ms(med.get("translator", 0.0))},
        "fallback": med.get("translator", 0.0) > 0,
        "hit_ms": ms(statistics.median(hits)),
        "hit_compile_ms": ms(statistics.median(hit_compiles)),
    }


def summarize(results: list[dict], slowest: int) -> dict:
    ok = [r for r in results if r["compiled"]]
    cold = [r["cold_ms"] for r in ok]
    hit = [r["hit_ms"] for r in ok]
    hitc = [r["hit_compile_ms"] for r in ok]
    top = sorted(ok, key=lambda r: -r["cold_ms"])[:slowest]
    return {
        "schemas": len(results), "compiled": len(ok), "refused": len(results) - len(ok),
        "refusals": dict(collections.Counter(r["reason"] for r in results
                                             if not r["compiled"]).most_common()),
        "translator_fallbacks": sum(r["fallback"] for r in ok),
        "refused_max_ms": max((r["refused_ms"] for r in results if not r["compiled"]),
                              default=0.0),
        "cold_ms": {"p50": pct(cold, 0.5), "p90": pct(cold, 0.9), "p99": pct(cold, 0.99),
                    "max": max(cold, default=float("nan"))},
        "validate_ms": {"p50": pct([r["validate_ms"] for r in ok], 0.5),
                        "p99": pct([r["validate_ms"] for r in ok], 0.99)},
        "hit_ms": {"p50": pct(hit, 0.5), "p99": pct(hit, 0.99), "max": max(hit, default=0.0)},
        "hit_compile_ms": {"p50": pct(hitc, 0.5), "p99": pct(hitc, 0.99)},
        "slowest": [{"unique_id": r["unique_id"], "subset": r["subset"],
                     "schema_kb": r["schema_kb"], "cold_ms": r["cold_ms"],
                     "validate_ms": r["validate_ms"], **r["split_ms"],
                     "hit_ms": r["hit_ms"]} for r in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="cold measurements per schema (the median is reported)")
    ap.add_argument("--whitespace", default=None,
                    help="JSON whitespace_pattern (default: the server's separators style)")
    ap.add_argument("--slowest", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import radixlm  # noqa: F401  (before torch: OpenMP's spin-wait bound)
    from radixlm.constraints import create_grammar_backend
    from radixlm.constraints.specs import ConstraintSpec, normalize_json_schema
    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.weights import load_tokenizer, resolve_model

    host = host_info()
    print(host_line(host), flush=True)
    rows = [json.loads(line) for line in args.data.open()]
    rows = rows[: args.limit] if args.limit else rows
    tok = load_tokenizer(resolve_model("smollm2-135m-instruct"))
    be = create_grammar_backend(tok, len(tok), [tok.eos_token_id], backend="llguidance",
                                max_workers=1)
    timer = StageTimer()
    instrument(be, timer)
    warm = ConstraintSpec("json_schema", normalize_json_schema(
        {"type": "object", "properties": {"a": {"type": "string"}}}), args.whitespace)
    be.validate(warm)
    be.compile(warm)  # first-use costs (imports, thread start) out of the first schema

    results = []
    t0 = time.perf_counter()
    for row in rows:
        spec = ConstraintSpec("json_schema", normalize_json_schema(row["schema"]),
                              args.whitespace)
        r = measure(be, timer, spec, max(1, args.rounds))
        r.update(unique_id=row["unique_id"], subset=row["subset"],
                 schema_kb=round(len(spec.value) / 1024, 1))
        results.append(r)
    be.shutdown()
    out = {"host": host, "data": str(args.data), "rounds": args.rounds,
           "whitespace": args.whitespace, "wall_s": round(time.perf_counter() - t0, 1),
           **summarize(results, args.slowest)}
    print(json.dumps(out, indent=1))
    s = out
    print(f"\n{host_line(host)}")
    print(f"compiled {s['compiled']}/{s['schemas']}, refused {s['refused']}"
          f" (slowest refusal {s['refused_max_ms']} ms; translator fallbacks among the"
          f" compiled: {s['translator_fallbacks']})")
    for why, n in s["refusals"].items():
        print(f"  {n:>3} x {why}")
    c, h, hc, v = s["cold_ms"], s["hit_ms"], s["hit_compile_ms"], s["validate_ms"]
    print(f"{'ms':<34}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    print(f"{'cold (validate + compile)':<34}{c['p50']:>9}{c['p90']:>9}{c['p99']:>9}"
          f"{c['max']:>9}")
    print(f"{'  of which validate':<34}{v['p50']:>9}{'':>9}{v['p99']:>9}")
    print(f"{'hit (validate + compile, cached)':<34}{h['p50']:>9}{'':>9}{h['p99']:>9}"
          f"{h['max']:>9}")
    print(f"{'  of which compile (hit + copy)':<34}{hc['p50']:>9}{'':>9}{hc['p99']:>9}")
    print(f"\nslowest {len(s['slowest'])} cold (ms):")
    print(f"{'unique_id':<44}{'KB':>7}{'cold':>8}{'meta':>7}{'prep':>7}{'val+':>7}"
          f"{'build':>8}{'transl':>8}{'hit':>7}")
    for r in s["slowest"]:
        print(f"{r['unique_id'][:43]:<44}{r['schema_kb']:>7}{r['cold_ms']:>8}"
              f"{r['meta_check']:>7}{r['prepare_schema']:>7}{r['validate_rest']:>7}"
              f"{r['build']:>8}{r['translator']:>8}{r['hit_ms']:>7}")
    print("(meta: meta_check; prep: prepare_schema; val+: rest of validate, mostly llguidance's"
          " grammar_from_json_schema; build: LLMatcher + first mask, incl. a refused build;"
          " transl: regex-translator fallback)")
    if args.json:
        args.json.write_text(json.dumps({"summary": out, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
