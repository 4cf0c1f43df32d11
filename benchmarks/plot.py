"""The benchmarks' JSON (`--out` of bench_vs_llamacpp.py, bench_offline.py,
bench_decode_step.py, bench_prefix.py) as PNG plots.

    .venv/bin/python benchmarks/plot.py RESULTS.json ... [--out-dir docs/img] [--note TEXT]

Each file's kind is read from its keys; several files of one kind are several hosts (or,
for bench_prefix.py, several KV pool sizes). Plots written, where their inputs are given:

* ``headline.png``: radixlm's speedup over llama.cpp and over HF transformers, per host:
  the median of per-round ratios (bars) and each round's ratio (dots); > 1: radixlm faster.
* ``decode_step.png``: one decode step split into linears, attention and the rest, per
  batch size and path (torch reference, native library).
* ``throughput_batch.png``: tokens/s against batch size (bench_offline.py's static batches
  for radixlm and HF; decode steps alone from bench_decode_step.py).
* ``prefix_hit_rate.png``: the radix cache's prefix hit rate against the KV pool size per
  workload, beside the workload's optimal hit rate.

Needs matplotlib (`pip install -e '.[plot]'`); it is a benchmark-only dependency.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

LLAMA_METRICS = {"single_decode_tok_s": "single-stream decode", "ttft_s": "TTFT (64 tokens)",
                 "prefill_tok_s": "prefill"}
HF_METRICS = {"single_decode_tok_s": "single-stream decode", "prefill_tok_s": "prefill"}
STAGES = (("linears_ms", "linears"), ("attention_ms", "attention"), ("rest_ms", "rest"))


def kind_of(results: dict[str, Any]) -> str:
    """Which benchmark wrote `results`."""
    if "llama_cpp" in results:
        return "vs_llamacpp"
    if "reference_path" in results:
        return "decode_step"
    if "workloads" in results:
        return "prefix"
    if "radixlm" in results and "config" in results:
        return "offline"
    raise ValueError("not the JSON of bench_vs_llamacpp.py, bench_offline.py, "
                     "bench_decode_step.py or bench_prefix.py")


def host_label(host: dict[str, Any]) -> str:
    """A short name of the host a result was measured on."""
    isa = host.get("isa") or []
    top = ("AMX" if "amx_int8" in isa else "AVX-512 BF16" if "avx512_bf16" in isa
           else "AVX-512" if "avx512f" in isa else "AVX2" if "avx2" in isa else "generic")
    cpu = str(host.get("cpu", "?")).replace("(R)", "").replace(" Processor", "")
    return f"{cpu}, {host.get('cores', '?')} cores, {top}"


def _batch_sizes(results: dict[str, Any], kind: str) -> list[int]:
    return sorted({int(k[len("batch"):].split("_")[0]) for k in results["radixlm"]
                   if k.startswith("batch") and k.endswith(f"_{kind}_tok_s")})


def headline_rows(files: list[dict[str, Any]]) -> dict[str, list[tuple[str, str, float,
                                                                        list[float]]]]:
    """Per host: (metric, peer, median ratio, per-round ratios), radixlm over the peer."""
    rows: dict[str, list] = defaultdict(list)
    for r in files:
        host = host_label(r["host"])
        if kind_of(r) == "vs_llamacpp":
            for key, name in LLAMA_METRICS.items():
                rows[host].append((name, "llama.cpp", r["ratio_median"][key],
                                   [p[key] for p in r["ratio_per_round"]]))
        elif kind_of(r) == "offline" and "speedup" in r:
            metrics = dict(HF_METRICS)
            for b in _batch_sizes(r, "equal")[-1:]:
                metrics[f"batch{b}_equal_tok_s"] = f"batch {b}, equal lengths"
                metrics[f"batch{b}_mixed_tok_s"] = f"batch {b}, mixed lengths"
            for key, name in metrics.items():
                rows[host].append((name, "HF transformers", r["speedup"][key],
                                   [p[key] for p in r["speedup_per_round"]]))
    return dict(rows)


def throughput_points(files: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Lines of (batch size, tokens/s) named "system, kind (host)"."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in files:
        host = host_label(r["host"])
        if kind_of(r) == "offline":
            systems = [s for s in ("radixlm", "hf_transformers") if s in r]
            for system in systems:
                for kind in ("equal", "mixed"):
                    pts = [(b, r[system][f"batch{b}_{kind}_tok_s"])
                           for b in _batch_sizes(r, kind)]
                    name = "HF" if system == "hf_transformers" else "radixlm"
                    lines[f"{name}, {kind} lengths, end to end ({host})"] = pts
        elif kind_of(r) == "decode_step":
            for path in ("native", "reference"):
                pts = sorted((int(b), int(b) / v["step_ms"] * 1000) for b, v in r[path].items())
                lines[f"{path} decode steps alone ({host})"] = pts
    return lines


def hit_rate_points(files: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, float]]]:
    """Per workload: (KV pool tokens, hit rate with the radix cache, optimal hit rate)."""
    out: dict[str, list] = defaultdict(list)
    for r in files:
        size = r["config"]["max_total_tokens"]
        for name, w in r["workloads"].items():
            if name != "no_sharing":
                on = w["radix_on"]
                out[name].append((size, on["hit_rate"], on["optimal_hit_rate"]))
    return {k: sorted(v) for k, v in out.items()}


# ---------------------------------------------------------------------- drawing
def _plt():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("benchmarks/plot.py needs matplotlib: pip install -e '.[plot]'") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_ticks(ax: Any, values: list[int]) -> None:
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()


def _save(plt: Any, fig: Any, out: Path, hosts: list[str], note: str) -> None:
    """Write `fig` with the hosts and the note under it."""
    text = "; ".join(sorted(set(hosts))) + (f". {note}" if note else "")
    lines = textwrap.wrap(text, int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.015 + 0.035 * len(lines) * 4.2 / fig.get_figheight(), 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_headline(files: list[dict[str, Any]], out: Path, note: str) -> None:
    plt = _plt()
    rows = headline_rows(files)
    fig, axes = plt.subplots(1, len(rows), figsize=(6.5 * len(rows), 4.2), squeeze=False)
    colors = {"llama.cpp": "#d9822b", "HF transformers": "#4a7bd0"}
    for ax, (host, items) in zip(axes[0], rows.items()):
        labels = [f"{m}\nvs {p}" for m, p, _, _ in items]
        ys = range(len(items))
        ax.barh(ys, [med for _, _, med, _ in items], color=[colors[p] for _, p, _, _ in items],
                alpha=0.8)
        for y, (_, _, med, per) in zip(ys, items):
            ax.plot(per, [y] * len(per), "k.", ms=5)
            ax.text(med * 1.04, y, f"{med:.2f}x", va="center", fontsize=8)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(host, fontsize=9)
        ax.set_xlabel("radixlm speedup (median of rounds; dots: each round)")
    fig.suptitle("radixlm vs llama.cpp and HF transformers, SmolLM2-135M Q4_1")
    _save(plt, fig, out, list(rows), note)


def plot_decode_step(results: dict[str, Any], out: Path, note: str) -> None:
    plt = _plt()
    paths = [p for p in ("reference", "native", "native_fp32") if p in results]
    batches = sorted(results["native"], key=int)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(paths)
    colors = ("#4a7bd0", "#d9822b", "#7fb88a")
    for i, path in enumerate(paths):
        xs = [j + i * width for j in range(len(batches))]
        bottom = [0.0] * len(batches)
        for (key, stage), color in zip(STAGES, colors):
            vals = [results[path][b][key] for b in batches]
            ax.bar(xs, vals, width * 0.95, bottom=bottom, color=color,
                   label=stage if i == 0 else None, edgecolor="white")
            bottom = [a + v for a, v in zip(bottom, vals)]
        for x, total in zip(xs, bottom):
            ax.text(x, total, path.replace("_", "\n"), ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + width * (len(paths) - 1) / 2 for j in range(len(batches))],
                  [f"batch {b}" for b in batches])
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"One decode step, context {results['context']}: reference = "
                 f"{results['reference_path']}", fontsize=9)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    _save(plt, fig, out, [host_label(results["host"])], note)


def plot_throughput(files: list[dict[str, Any]], out: Path, note: str) -> None:
    plt = _plt()
    lines = throughput_points(files)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, pts in lines.items():
        style = "--" if name.startswith("HF") else ":" if "alone" in name else "-"
        ax.plot([b for b, _ in pts], [v for _, v in pts], style, marker="o", label=name)
    ax.set_xscale("log", base=2)
    _plain_ticks(ax, sorted({b for pts in lines.values() for b, _ in pts}))
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("generated tokens/s")
    ax.set_title("Throughput against batch size")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(plt, fig, out, [host_label(r["host"]) for r in files], note)


def plot_prefix(files: list[dict[str, Any]], out: Path, note: str) -> None:
    plt = _plt()
    points = hit_rate_points(files)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for (name, pts), color in zip(points.items(), ("#4a7bd0", "#d9822b", "#7fb88a")):
        sizes = [s for s, _, _ in pts]
        ax.plot(sizes, [h for _, h, _ in pts], "-o", color=color, label=f"{name}: radix cache")
        ax.plot(sizes, [o for _, _, o in pts], "--", color=color, alpha=0.6,
                label=f"{name}: optimal")
    ax.set_xscale("log", base=2)
    _plain_ticks(ax, sorted({s for pts in points.values() for s, _, _ in pts}))
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("KV pool (tokens), both the cache and the running requests")
    ax.set_ylabel("prompt tokens served from the cache")
    ax.set_title("Prefix hit rate against cache size (bench_prefix.py)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(plt, fig, out, [host_label(r["host"]) for r in files], note)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="benchmark --out JSON files")
    ap.add_argument("--out-dir", default="docs/img")
    ap.add_argument("--note", default="", help="added under every plot (e.g. the conditions)")
    args = ap.parse_args(argv)
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name in args.files:
        results = json.loads(Path(name).read_text())
        try:
            by_kind[kind_of(results)].append(results)
        except ValueError as exc:
            ap.error(f"{name}: {exc}")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if by_kind["vs_llamacpp"] or by_kind["offline"]:
        plot_headline(by_kind["vs_llamacpp"] + by_kind["offline"], out / "headline.png",
                      args.note)
        written.append("headline.png")
    if by_kind["decode_step"]:
        plot_decode_step(by_kind["decode_step"][0], out / "decode_step.png", args.note)
        written.append("decode_step.png")
    if by_kind["offline"] or by_kind["decode_step"]:
        plot_throughput(by_kind["offline"] + by_kind["decode_step"],
                        out / "throughput_batch.png", args.note)
        written.append("throughput_batch.png")
    if by_kind["prefix"]:
        plot_prefix(by_kind["prefix"], out / "prefix_hit_rate.png", args.note)
        written.append("prefix_hit_rate.png")
    for name in written:
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
