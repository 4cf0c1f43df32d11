"""complete_within_max_tokens on the JSONSchemaBench sample: schema-valid JSON within the budget.

    .venv/bin/python benchmarks/bench_budget_close.py [--budgets 256,64] [--compare-off]
        [--limit N] [--batch 32] [--temperature 0] [--json out.json]

One chat-templated prompt per schema of the shared sample (shared/data; the schema's text in
the prompt, truncated), constrained by the schema (``json_schema``), submitted in batches
(``Engine.generate`` with a list of prompts) to the embedded model. Per budget
(``max_new_tokens``), with ``complete_within_max_tokens`` on (and, ``--compare-off``, off: the
baseline cut rate), each request is one of:

- refused at compile: finish ``abort`` / ``invalid_constraint`` not about the budget (or the
  engine's synchronous check refused the spec before submission);
- refused for the budget: the shortest valid document is longer than ``max_new_tokens``;
- valid: ``json.loads`` + the schema's draft validator (format checker on) accept the text;
- invalid: parses but fails the schema, or a stop without parseable JSON (a violation);
- truncated: finish ``length`` and the text does not parse (the cut the option removes);
- error: any other abort (a crash in the engine).

Also: how many were closed by the budget (``meta_info.closed_by_budget``), the median and max
``closed_at`` (output tokens before the forced close), wall time and generated tokens/s.
Target (issue #32): with the option on, every compiled schema gives schema-valid JSON at 256
and 64 tokens; 0 violations. Exit status 1 on any violation, truncation with the option on,
or error.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import jsonschema

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"
SCHEMA_CHARS = 1500  # schema text kept in the prompt
BUDGET_MSG = "the shortest valid output takes"


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def prompt_for(tokenizer, schema) -> str:
    text = json.dumps(schema, separators=(",", ":"))
    if len(text) > SCHEMA_CHARS:
        text = text[:SCHEMA_CHARS] + " ...(truncated)"
    return chat(tokenizer, "Write one JSON instance that is valid against this JSON schema. "
                           f"Reply with the JSON only.\n\nSchema:\n{text}")


def validator_for(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def classify(out: dict, validator) -> tuple[str, str]:
    """(category, detail) of one finished request; see the module doc."""
    meta = out["meta_info"]
    fr = meta["finish_reason"] or {}
    text = out["text"]
    if fr.get("type") == "abort":
        msg = str(fr.get("message", ""))
        if fr.get("error") == "invalid_constraint":
            return ("refused_budget" if BUDGET_MSG in msg else "refused_compile"), msg
        return "error", f"{fr}"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        if fr.get("type") == "length":
            return "truncated", f"finish length, {exc}"
        return "invalid", f"finish {fr.get('type')}, not JSON: {exc}"
    err = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if err is None:
        return "valid", ""
    return "invalid", f"schema: {err.message[:200]}"


def run_arm(engine, rows, prompts, budget: int, close: bool, temperature: float,
            batch: int) -> dict:
    """Every row at ``max_new_tokens=budget``, the option ``close``; counts + failures."""
    from radixlm.constraints import spec_from_sampling_params
    from radixlm.runtime.sampling_params import SamplingParams

    counts: collections.Counter = collections.Counter()
    failures, closed_at, submit = [], [], []
    for i, row in enumerate(rows):
        params = {"temperature": temperature, "max_new_tokens": budget,
                  "json_schema": json.dumps(row["schema"]),
                  "complete_within_max_tokens": close}
        try:  # the engine checks every spec of a generate() call before it submits any
            spec = spec_from_sampling_params(SamplingParams.from_dict(dict(params)),
                                             engine.config.json_whitespace)
            engine.grammar_backend.validate(spec)
        except ValueError as exc:
            counts["refused_compile"] += 1
            failures.append({"id": row["unique_id"], "reason": "refused_compile",
                             "detail": str(exc)[:120]})
            continue
        submit.append((i, params))
    wall, tokens, forced = 0.0, 0, 0
    for start in range(0, len(submit), batch):
        chunk = submit[start:start + batch]
        t0 = time.perf_counter()
        outs = engine.generate([prompts[i] for i, _ in chunk], [p for _, p in chunk])
        wall += time.perf_counter() - t0
        for (i, _), out in zip(chunk, outs):
            row, meta = rows[i], out["meta_info"]
            tokens += meta["completion_tokens"]
            forced += meta.get("forced_tokens", 0)
            kind, detail = classify(out, validator_for(row["schema"]))
            counts[kind] += 1
            if meta.get("closed_by_budget"):
                counts["closed_by_budget"] += 1
                closed_at.append(meta["closed_at"])
                if kind == "valid":
                    counts["closed_valid"] += 1
            if kind != "valid":
                failures.append({"id": row["unique_id"], "reason": kind,
                                 "detail": detail[:200], "text": out["text"][:120]})
    total = len(rows)
    compiled = total - counts["refused_compile"]
    admitted = compiled - counts["refused_budget"]
    return {
        "budget": budget, "option": "on" if close else "off", "schemas": total,
        "compiled": compiled, "refused_compile": counts["refused_compile"],
        "refused_budget": counts["refused_budget"], "admitted": admitted,
        "valid": counts["valid"], "invalid": counts["invalid"],
        "truncated": counts["truncated"], "error": counts["error"],
        "valid_pct_of_admitted": round(100 * counts["valid"] / max(1, admitted), 1),
        "valid_pct_of_compiled": round(100 * counts["valid"] / max(1, compiled), 1),
        "closed_by_budget": counts["closed_by_budget"],
        "closed_by_budget_valid": counts["closed_valid"],
        "closed_at_median": statistics.median(closed_at) if closed_at else None,
        "closed_at_max": max(closed_at) if closed_at else None,
        "wall_s": round(wall, 2), "generated_tokens": tokens, "forced_tokens": forced,
        "tok_s": round(tokens / wall, 1) if wall else 0.0,
        "failures": failures,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--budgets", default="256,64")
    ap.add_argument("--compare-off", action="store_true",
                    help="also run each budget with the option off (the baseline cut rate)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=32, help="requests per engine.generate call")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.data.open() if line.strip()]
    rows = rows[: args.limit] if args.limit else rows
    budgets = [int(b) for b in args.budgets.split(",")]
    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    out: dict = {"host": host_info(), "data": str(args.data), "temperature": args.temperature,
                 "batch": args.batch, "arms": []}
    with Engine(model="smollm2-135m-instruct", log_level="warning") as engine:
        prompts = [prompt_for(engine.tokenizer, r["schema"]) for r in rows]
        engine.generate(prompts[0], {"temperature": 0, "max_new_tokens": 4})  # warm up
        for budget in budgets:
            for close in ((True, False) if args.compare_off else (True,)):
                engine.flush_cache()  # each arm prefills its prompts alike
                arm = run_arm(engine, rows, prompts, budget, close, args.temperature,
                              args.batch)
                out["arms"].append(arm)
                print(f"budget {budget} option {arm['option']}: {arm['valid']}/"
                      f"{arm['admitted']} valid, {arm['wall_s']}s", file=sys.stderr)
    print(json.dumps({**out, "arms": [{k: v for k, v in a.items() if k != "failures"}
                                      for a in out["arms"]]}, indent=1))
    print(f"\n{host_line(out['host'])}")
    print(f"{'budget':>6} {'opt':<4}{'compiled':>9}{'ref cmp':>8}{'ref bud':>8}{'valid':>10}"
          f"{'invalid':>8}{'trunc':>6}{'err':>4}{'closed':>7}{'at p50':>7}{'at max':>7}"
          f"{'wall s':>8}{'tok/s':>7}")
    for a in out["arms"]:
        print(f"{a['budget']:>6} {a['option']:<4}{a['compiled']:>5}/{a['schemas']:<3}"
              f"{a['refused_compile']:>8}{a['refused_budget']:>8}"
              f"{a['valid']:>5}/{a['admitted']:<4}{a['invalid']:>8}{a['truncated']:>6}"
              f"{a['error']:>4}{a['closed_by_budget']:>7}{str(a['closed_at_median']):>7}"
              f"{str(a['closed_at_max']):>7}{a['wall_s']:>8.1f}{a['tok_s']:>7.1f}")
    for a in out["arms"]:
        bad = [f for f in a["failures"] if a["option"] == "on" or f["reason"] != "truncated"]
        if bad:
            print(f"\nbudget {a['budget']} option {a['option']}: not valid")
        for f in bad:
            print(f"  {f['id']:<40} {f['reason']:<16} {f['detail'][:120]!r}"
                  + (f" text={f['text']!r}" if "text" in f else ""))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    on = [a for a in out["arms"] if a["option"] == "on"]
    return 1 if any(a["invalid"] or a["truncated"] or a["error"] for a in on) \
        or any(a["invalid"] or a["error"] for a in out["arms"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
