"""JSON-schema coverage and soundness on the JSONSchemaBench sample.

For every schema: translate (or record the rejection reason), build the byte-level index of
the regex (same language as the token index), check every test instance serialized
compactly (a schema-invalid instance the automaton accepts is a *silent violation*), and
validate random walks with ``jsonschema`` (format checker on; a walk that fails is a silent
violation too). With ``--token-index`` also build the real SmolLM2 token index through the
backend (budgets on) and report its compile time.

    .venv/bin/python benchmarks/bench_schema_coverage.py [--lenient] [--token-index]
        [--walks 3] [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

from radixlm.constraints.schema import SchemaTranslator, check_schema
from radixlm.constraints.walk import byte_index, byte_random_walk, index_accepts

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"
WHITESPACE = r"[ ]?"


def reason(msg: str) -> str:
    """A short rejection category: the message up to the pointer, details dropped."""
    msg = re.sub(r" at JSON pointer.*", "", msg)
    return re.sub(r"\(.*|: .*|'[^']*/[^']*'", "", msg).strip()[:60]


def check_one(row: dict, strict: bool, walks: int, backend=None) -> dict:
    schema = row["schema"]
    res = {"id": row["unique_id"], "subset": row["subset"], "compiled": False}
    t0 = time.perf_counter()
    try:
        cls = check_schema(schema)
        regex = SchemaTranslator(schema, cls, WHITESPACE, strict=strict).translate()
        index = byte_index(regex)
    except ValueError as exc:
        res["reason"] = reason(str(exc))
        return res
    res["translate_s"] = time.perf_counter() - t0
    res["compiled"] = True
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    counts = collections.Counter()
    for test in row["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
        accepted = index_accepts(index, text.encode("utf-8"))
        valid = validator.is_valid(test["data"])
        counts["valid" if valid else "invalid"] += 1
        counts["valid_accepted" if valid and accepted else "x"] += 1
        counts["invalid_rejected" if not valid and not accepted else "x"] += 1
        if accepted and not valid:
            counts["violations"] += 1
            res.setdefault("violation_examples", []).append(text[:200])
    for seed in range(walks):
        out = byte_random_walk(index, seed)
        if out is None:
            counts["walks_unfinished"] += 1
            continue
        counts["walks"] += 1
        try:
            ok = validator.is_valid(json.loads(out.decode("utf-8")))
        except ValueError:
            ok = False
        if not ok:
            counts["violations"] += 1
            res.setdefault("violation_examples", []).append(out[:200].decode("utf-8", "replace"))
    counts.pop("x", None)
    res.update(counts)
    if backend is not None:
        from radixlm.constraints.base import ConstraintSpec

        t1 = time.perf_counter()
        spec = ConstraintSpec("json_schema", json.dumps(schema), WHITESPACE)
        try:
            backend.compile_async(spec).result()
            res["index_s"] = time.perf_counter() - t1
        except ValueError as exc:
            res["index_error"] = reason(str(exc))
    return res


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(results: list[dict]) -> dict:
    groups = collections.defaultdict(list)
    for r in results:
        groups[r["subset"]].append(r)
        groups["ALL"].append(r)
    out = {}
    for name, rs in groups.items():
        comp = [r for r in rs if r["compiled"]]
        times = [r.get("index_s", r.get("translate_s", 0.0)) for r in comp]
        out[name] = {
            "schemas": len(rs), "compiled": len(comp),
            "rejected": dict(collections.Counter(r["reason"] for r in rs if not r["compiled"])),
            "valid_accepted": sum(r.get("valid_accepted", 0) for r in comp),
            "valid": sum(r.get("valid", 0) for r in comp),
            "invalid_rejected": sum(r.get("invalid_rejected", 0) for r in comp),
            "invalid": sum(r.get("invalid", 0) for r in comp),
            "walks": sum(r.get("walks", 0) for r in comp),
            "walks_unfinished": sum(r.get("walks_unfinished", 0) for r in comp),
            "silent_violations": sum(r.get("violations", 0) for r in comp),
            "index_errors": sum(1 for r in comp if "index_error" in r),
            "compile_p50_s": round(pct(times, 0.5), 4), "compile_p99_s": round(pct(times, 0.99), 4),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--lenient", action="store_true", help="prune unsupported optional parts")
    ap.add_argument("--token-index", action="store_true", help="also build the SmolLM2 index")
    ap.add_argument("--walks", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.data.open()]
    rows = rows[: args.limit] if args.limit else rows
    backend = None
    if args.token_index:
        from radixlm.constraints.outlines_backend import OutlinesGrammarBackend
        from radixlm.runtime.weights import load_tokenizer, resolve_model

        tok = load_tokenizer(resolve_model("smollm2-135m-instruct"))
        backend = OutlinesGrammarBackend(tok, len(tok), [tok.eos_token_id], disk_cache=False,
                                         strict_schema=not args.lenient, max_workers=1,
                                         memory_cache_size=1)
    t0 = time.perf_counter()
    results = [check_one(r, not args.lenient, args.walks, backend) for r in rows]
    summary = summarize(results)
    summary["ALL"]["wall_s"] = round(time.perf_counter() - t0, 1)
    if backend is not None:
        backend.shutdown()
    print(json.dumps(summary, indent=1))
    hdr = (f"{'subset':<18}{'n':>4}{'comp':>6}{'valid acc':>12}{'inval rej':>12}"
           f"{'walks':>7}{'viol':>6}{'p50 s':>8}{'p99 s':>8}  rejected")
    print(hdr)
    for name, s in sorted(summary.items(), key=lambda kv: (kv[0] == "ALL", kv[0])):
        print(f"{name:<18}{s['schemas']:>4}{s['compiled']:>6}"
              f"{s['valid_accepted']:>6}/{s['valid']:<5}{s['invalid_rejected']:>6}/{s['invalid']:<5}"
              f"{s['walks']:>7}{s['silent_violations']:>6}{s['compile_p50_s']:>8}"
              f"{s['compile_p99_s']:>8}  {s['rejected']}")
    for r in results:
        for ex in r.get("violation_examples", []):
            print("VIOLATION", r["id"], ex, file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 1 if summary["ALL"]["silent_violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
