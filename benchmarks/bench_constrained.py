"""Constrained vs unconstrained decoding speed, jump-forward on vs off, compile times.

    .venv/bin/python benchmarks/bench_constrained.py [--quick] [--out results.json]
        [--grammar-backend llguidance|outlines]

1. Tokens/s for the same prompts unconstrained vs JSON-schema-constrained at batch 1 and 16
   (greedy, ignore nothing: each request stops when its JSON closes or at max tokens).
2. Jump-forward on vs off on a key-heavy schema (end-to-end wall time, same prompts): the
   default JSON style (", " / ": "), no whitespace (SGLang's
   --constrained-json-disable-any-whitespace) and an optional space anywhere ("[ ]?").
3. Grammar compile time p50/p99 over the shared JSONSchemaBench sample (fresh compiles,
   the on-disk cache off).
4. Mask fill time per constrained step at batch 16 (the scheduler's ``_fill_bitmask``) as a
   share of the step.
Targets: constrained >= 0.95x unconstrained decode rate at batch 16; jump-forward >= 1.5x on
the key-heavy schema; mask fill <= 5% of the decode step at batch 16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "maxLength": 20}},
    "required": ["name", "age", "city"],
}
KEY_HEAVY = {
    "type": "object",
    "properties": {k: {"type": "string", "maxLength": 8} for k in (
        "customer_first_name", "customer_last_name", "customer_email_address",
        "shipping_street_address", "shipping_postal_code", "shipping_country_name",
        "billing_account_identifier", "preferred_delivery_window")},
    "required": ["customer_first_name", "customer_last_name", "customer_email_address",
                 "shipping_street_address", "shipping_postal_code", "shipping_country_name",
                 "billing_account_identifier", "preferred_delivery_window"],
}
SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench_sample.jsonl"


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def run(engine, prompts, params) -> tuple[float, int, list[dict]]:
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t
    outs = outs if isinstance(outs, list) else [outs]
    return wall, sum(o["meta_info"]["completion_tokens"] for o in outs), outs


def pct(values, q):
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternations of each A/B pair (free/constrained, jump-forward on/off)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--grammar-backend", default="llguidance")
    args = ap.parse_args()
    from radixlm.native.build import host_info, host_line
    from radixlm.runtime.engine import Engine

    results: dict = {"host": host_info(), "grammar_backend": args.grammar_backend}
    names = ["Alice", "Bob", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana"]
    max_new = 48 if args.quick else 96
    with Engine(log_level="warning", grammar_backend=args.grammar_backend) as engine:
        mask_s: list[float] = []
        spec = engine.scheduler.speculation
        fill = spec._bitmask  # a step's masks (a verified draft's rows: its drafting check's)

        def timed_fill(*args, _fill=fill):
            t0 = time.perf_counter()
            out = _fill(*args)
            if out is not None:
                mask_s.append(time.perf_counter() - t0)
            return out

        spec._bitmask = timed_fill
        tok = engine.tokenizer
        prompts = [chat(tok, f"Describe a person called {names[i % 8]} as JSON with name, age "
                             f"and city.") for i in range(16)]
        free = {"temperature": 0, "max_new_tokens": max_new}
        schema = {**free, "json_schema": json.dumps(PERSON)}
        engine.generate(prompts[:2], schema)  # compile + warm up
        for batch in (1, 16):
            ps = prompts[:batch] if batch > 1 else prompts[0]
            arms: dict[str, list] = {"free": [], "con": []}
            con_wall, steps0 = 0.0, len(mask_s)
            for _ in range(args.rounds):  # alternate the arms; medians over rounds
                arms["free"].append(run(engine, ps, free))
                arms["con"].append(run(engine, ps, schema))
                con_wall += arms["con"][-1][0]
            fills = mask_s[steps0:]
            med = {k: {"e2e": statistics.median(n / w for w, n, _ in v),
                       "decode": statistics.median(_decode_rate(o) for _, _, o in v)}
                   for k, v in arms.items()}
            outs = arms["con"][-1][2]
            valid = sum(_valid(o["text"]) for o in outs)
            results[f"batch{batch}"] = {
                "unconstrained_tok_s": med["free"]["e2e"], "constrained_tok_s": med["con"]["e2e"],
                "e2e_ratio": med["con"]["e2e"] / med["free"]["e2e"],
                "unconstrained_decode_tok_s": med["free"]["decode"],
                "constrained_decode_tok_s": med["con"]["decode"],
                "ratio": med["con"]["decode"] / med["free"]["decode"],
                "valid_json": f"{valid}/{batch}",
                "mask_fill_ms_per_step": 1e3 * statistics.fmean(fills) if fills else 0.0,
                "mask_fill_share_of_step": sum(fills) / con_wall if con_wall else 0.0}
        kh = {"temperature": 0, "max_new_tokens": 160, "json_schema": json.dumps(KEY_HEAVY)}
        # the default style (", " and ": ", every separator forced text), none at all
        # (SGLang's --constrained-json-disable-any-whitespace) and an optional space between
        # any two tokens ([ ]?, the default before session 5: the model decides each)
        variants = {"jump_forward": kh, "jump_forward_compact": {**kh, "whitespace_pattern": ""},
                    "jump_forward_optional_space": {**kh, "whitespace_pattern": "[ ]?"}}
        kp = [chat(tok, f"Fill in an order form for customer {n}.") for n in names[:4]]
        # Both engines live side by side and take turns, so slow phases of a shared VM hit
        # both arms alike; the speedup is the median over rounds.
        with Engine(log_level="warning", enable_jump_forward=False,
                    grammar_backend=args.grammar_backend) as off_engine:
            for key, params in variants.items():
                walls: dict[str, list[float]] = {"on": [], "off": []}
                for e in (engine, off_engine):
                    e.generate(kp[0], params)  # compile + warm up
                for _ in range(args.rounds):
                    for name, e in (("on", engine), ("off", off_engine)):
                        e.flush_cache()
                        w, n, outs = run(e, kp, params)
                        walls[name].append(w)
                        if name == "on":
                            n_on, outs_on = n, outs
                        else:
                            n_off, outs_off = n, outs
                w_on, w_off = statistics.median(walls["on"]), statistics.median(walls["off"])
                results[key] = {
                    "on_s": w_on, "off_s": w_off, "speedup": w_off / w_on,
                    "speedup_per_round": [f / o for f, o in zip(walls["off"], walls["on"])],
                    "forced_tokens": sum(o["meta_info"].get("forced_tokens", 0)
                                         for o in outs_on),
                    "tokens_on": n_on, "tokens_off": n_off,
                    "valid_on": sum(_valid(o["text"]) for o in outs_on),
                    "valid_off": sum(_valid(o["text"]) for o in outs_off)}
    results["compile"] = _compile_times(tok, args.grammar_backend,
                                        limit=40 if args.quick else None)
    print(json.dumps(results, indent=2))
    print(f"\n{host_line(results['host'])}")
    print(f"\n{'workload':<10}{'free e2e':>10}{'constr e2e':>12}{'free decode':>13}"
          f"{'constr decode':>15}{'ratio':>7}  (tok/s; ratio of decode rates)")
    for b in ("batch1", "batch16"):
        r = results[b]
        print(f"{b:<10}{r['unconstrained_tok_s']:>10.1f}{r['constrained_tok_s']:>12.1f}"
              f"{r['unconstrained_decode_tok_s']:>13.1f}{r['constrained_decode_tok_s']:>15.1f}"
              f"{r['ratio']:>7.2f}  mask fill {r['mask_fill_ms_per_step']:.2f} ms/step = "
              f"{100 * r['mask_fill_share_of_step']:.1f}% of the step")
    for key, label in (("jump_forward", "default style"), ("jump_forward_compact", "no whitespace"),
                       ("jump_forward_optional_space", "[ ]? whitespace")):
        jf = results[key]
        print(f"jump-forward ({label}): on {jf['on_s']:.2f}s off {jf['off_s']:.2f}s speedup "
              f"{jf['speedup']:.2f}x (rounds "
              f"{', '.join(f'{x:.2f}' for x in jf['speedup_per_round'])}) forced "
              f"{jf['forced_tokens']} tokens, valid {jf['valid_on']}/{len(kp)}")
    c = results["compile"]
    print(f"compile: {c['compiled']}/{c['total']} p50 {c['p50_s']:.3f}s p99 {c['p99_s']:.3f}s")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


def _decode_rate(outs: list[dict]) -> float:
    """Aggregate decode rate: sum over requests of tokens after the first / time after the
    first token. JSON closes sooner than free text, so end-to-end tok/s would charge the
    (equal) prefill to fewer tokens; this compares the decode phases like for like."""
    rate = 0.0
    for o in outs:
        m = o["meta_info"]
        if m["completion_tokens"] > 1 and m["e2e_latency"] > m["ttft"]:
            rate += (m["completion_tokens"] - 1) / (m["e2e_latency"] - m["ttft"])
    return rate


def _valid(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _compile_times(tokenizer, backend_name: str, limit=None) -> dict:
    from radixlm.constraints import ConstraintSpec, create_grammar_backend

    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    rows = rows[:limit] if limit else rows
    extra = {"disk_cache": False} if backend_name == "outlines" else {}
    backend = create_grammar_backend(tokenizer, vocab_size=len(tokenizer),
                                     eos_token_ids={tokenizer.eos_token_id},
                                     backend=backend_name, **extra)
    times, ok = [], 0
    for row in rows:
        spec = ConstraintSpec("json_schema", json.dumps(row["schema"], sort_keys=True))
        t = time.perf_counter()
        try:
            backend.validate(spec)
            backend.compile_async(spec).result(timeout=120)
            ok += 1
            times.append(time.perf_counter() - t)
        except Exception:  # rejected schemas are counted, not timed
            pass
    backend.shutdown()
    return {"total": len(rows), "compiled": ok, "p50_s": pct(times, 0.5),
            "p99_s": pct(times, 0.99), "mean_s": statistics.fmean(times) if times else 0.0}


if __name__ == "__main__":
    main()
