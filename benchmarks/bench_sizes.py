"""radixlm vs llama.cpp at the sizes people run: random-weight GGUFs at real models' shapes
(``make_gguf.py``, quantized by llama.cpp), each compared by ``bench_vs_llamacpp.py`` in a
process of its own; one table of decode, prefill, TTFT, load time and peak memory for both
systems side by side, with the ratios per round and their median.

    make bench-sizes
    .venv/bin/python benchmarks/bench_sizes.py [--models llama-1b:Q4_K_M,llama-8b:Q4_K_M]
        [--rounds 3] [--out-dir ~/.cache/radixlm/bench-models] [--llama-python PY]
        [--out bench_results/bench-sizes.json] [-- more bench_vs_llamacpp.py flags]

radixlm loads each file once before its measured load (``--no-prime``: not), so a load
that fills its cache (a converted copy) is reported beside the steady-state one. A model
neither system can hold in this machine's memory (its estimated file size, KV cache
and runtime allowance against MemAvailable) is not made and reported as not fitting; a
system that does not fit is reported so by the comparison (see ``bench_vs_llamacpp.py``),
never left to the OOM killer. The host line first; JSON (every comparison's own) to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_gguf  # noqa: E402
from bench_vs_llamacpp import GIB, RUNTIME_ALLOWANCE  # noqa: E402
from llamacpp_common import mem_available  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = "llama-1b:Q4_K_M,llama-1b:Q6_K,llama-1b:Q8_0,llama-3b:Q4_K_M,llama-8b:Q4_K_M"
# llama.cpp's file sizes per weight at these shapes (K-quant mixes keep some tensors wider)
BITS_PER_WEIGHT = {"Q4_K_M": 5.0, "Q5_K_M": 5.8, "Q6_K": 6.6, "Q8_0": 8.5, "Q4_0": 4.6,
                   "Q4_1": 5.1, "F16": 16.0, "F32": 32.0}
ROWS = (("single_decode_tok_s", "decode tok/s"), ("prefill_tok_s", "prefill tok/s"),
        ("ttft_s", "TTFT 64 tok, s"), ("start_to_ready_s", "load: start->ready s"),
        ("construct_s", "load: construct s"), ("peak_rss_gib", "peak RSS GiB"))


def parse_models(text: str) -> list[tuple[str, str]]:
    """``shape:type,...`` -> [(shape, type)], refusing unknown names."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        shape, _, qtype = item.partition(":")
        if shape not in make_gguf.SHAPES:
            raise ValueError(f"unknown shape {shape!r} in {item!r} "
                             f"(known: {', '.join(make_gguf.SHAPES)})")
        if qtype not in BITS_PER_WEIGHT:
            raise ValueError(f"unknown type {qtype!r} in {item!r} "
                             f"(known: {', '.join(BITS_PER_WEIGHT)})")
        out.append((shape, qtype))
    if not out:
        raise ValueError("--models names no model")
    return out


def estimated_need(shape_name: str, qtype: str, ctx: int) -> int:
    """The smaller system's estimated resident need, before the file exists."""
    shape = make_gguf.SHAPES[shape_name]
    size = make_gguf.n_params(shape) * BITS_PER_WEIGHT[qtype] / 8
    kv = 2 * 2 * shape.layers * shape.kv_heads * shape.head_dim * ctx
    return int(size + kv + min(RUNTIME_ALLOWANCE.values()))


def run_one(args, shape: str, qtype: str, extra: list[str]) -> dict:
    name = f"{shape}:{qtype}"
    need = estimated_need(shape, qtype, args.ctx)
    avail = mem_available() - int(args.mem_reserve_gib * GIB)
    if need > avail:
        print(f"{name}: does not fit for either system (about {need / GIB:.1f} GiB needed, "
              f"{avail / GIB:.1f} GiB available above the reserve): not made", flush=True)
        return {"model": name, "status": f"does not fit for either system (about "
                f"{need / GIB:.1f} GiB needed, {avail / GIB:.1f} GiB available)",
                "need_gib": need / GIB, "available_gib": avail / GIB}
    t0 = time.perf_counter()
    existed = make_gguf.model_path(args.out_dir, shape, qtype).exists()
    try:
        path = make_gguf.make_model(shape, qtype, args.out_dir, llama_python=args.llama_python)
    except (ValueError, RuntimeError) as e:
        print(f"{name}: could not be made: {e}", flush=True)
        return {"model": name, "status": f"not made: {e}"}
    made = {"path": str(path), "size_gib": path.stat().st_size / GIB, "reused": existed,
            "make_s": time.perf_counter() - t0}
    out = Path(args.out).with_name(f"{Path(args.out).stem}.{shape}-{qtype}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_vs_llamacpp.py"), "--model",
           str(path), "--rounds", str(args.rounds), "--ctx", str(args.ctx),
           "--mem-reserve-gib", str(args.mem_reserve_gib), "--out", str(out), *extra]
    if not args.no_prime:
        cmd.append("--prime-radixlm-cache")
    if args.llama_python:
        cmd += ["--llama-python", args.llama_python]
    print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
    out.unlink(missing_ok=True)
    rc = subprocess.run(cmd).returncode
    if not out.exists():
        return {"model": name, "file": made, "status": f"comparison failed ({rc})"}
    result = json.loads(out.read_text())
    return {"model": name, "file": made, **result}


def table(results: list[dict]) -> None:
    """One row per model and metric: both systems, the median ratio, the per-round ones."""
    print(f"\n{'model':<17}{'metric':<22}{'radixlm':>10}{'llama.cpp':>11}{'ratio':>7}"
          "  per round (>1: radixlm)")
    for res in results:
        name = res["model"]
        if "rounds" not in res:
            print(f"{name:<17}{res['status']}")
            continue
        for system, why in res.get("does_not_fit", {}).items():
            print(f"{name:<17}{system}: does not fit (needs about {why['need_gib']:.1f} GiB, "
                  f"{why['available_gib']:.1f} GiB available)")
        if res.get("status", "ok") != "ok":
            print(f"{name:<17}stopped: {res['status']}")
        for key, label in ROWS:
            ours, theirs, ratio, per = _cells(res, key)
            if ours is None and theirs is None:
                continue
            print(f"{name:<17}{label:<22}{_num(ours):>10}{_num(theirs):>11}{_num(ratio, 2):>7}"
                  f"  {per}")
        first = res.get("first_load", {})
        if first.get("cache_written_gib"):
            print(f"{name:<17}{'load: first, s':<22}{_num(first['start_to_ready_s']):>10}"
                  f"  (filling radixlm's cache: {first['cache_written_gib']:.2f} GiB written, "
                  f"peak RSS {first['peak_rss_gib']:.2f} GiB)")
        written = next((v.get("cache_written_gib") for k, v in res.get("load", {}).items()
                        if k.startswith("radixlm")), None)
        if written:
            print(f"{name:<17}{'load: cache written GiB':<22}{_num(written):>10}"
                  "  (radixlm's load above includes writing it)")
    if any(not r.get("alternated", True) for r in results):
        print("(a model whose systems ran one after the other says so in its JSON: "
              "alternated false)")


def _cells(res: dict, key: str):
    """(radixlm, llama.cpp, median ratio, per-round ratios) of a metric; radixlm: the first
    of its engines where the comparison ran several."""
    ours_name = next((s for s in res.get("systems", []) if s.startswith("radixlm")), "radixlm")
    suffix = ours_name[len("radixlm"):]
    load = res.get("load", {})
    if key in ("start_to_ready_s", "construct_s", "peak_rss_gib"):
        ours = load.get(ours_name, {}).get(key)
        theirs = load.get("llama_cpp", {}).get(key)
        ratio = res.get(f"load_ratio{suffix}", {}).get(key)
        return ours, theirs, ratio, ""
    ours = res.get(ours_name, {}).get(key)
    theirs = res.get("llama_cpp", {}).get(key)
    per_round = res.get(f"ratio_per_round{suffix}", [])
    ratio = (statistics.median(p[key] for p in per_round) if per_round else None)
    return ours, theirs, ratio, " ".join(f"{p[key]:.2f}" for p in per_round)


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help="shape:type,... (shapes: "
                    + ", ".join(make_gguf.SHAPES) + ")")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--out-dir", type=Path, default=make_gguf.DEFAULT_OUT)
    ap.add_argument("--llama-python", default=None,
                    help="interpreter with llama_cpp (default .venv-llamacpp/bin/python)")
    ap.add_argument("--mem-reserve-gib", type=float, default=1.5)
    ap.add_argument("--no-prime", action="store_true",
                    help="measure radixlm's first load of each file (by default it loads once "
                         "before the measured load, so whatever it caches is in place; that "
                         "first load is reported beside it)")
    ap.add_argument("--out", default=str(ROOT / "bench_results" / "bench-sizes.json"))
    args = ap.parse_args(argv)
    try:
        models = parse_models(args.models)
    except ValueError as e:
        ap.error(str(e))
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    from radixlm.native.build import host_info, host_line

    host = host_info()
    print(host_line(host), flush=True)
    results = [run_one(args, shape, qtype, extra) for shape, qtype in models]
    print(f"\n{host_line(host)}; {os.cpu_count()} threads per system")
    table(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"host": host, "models": results}, indent=2))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
