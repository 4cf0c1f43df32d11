"""The native matmul per weight format: GGUF K-quants (Q4_K, Q5_K, Q6_K, read in their own
super-blocks; Q3_K as the engine holds it where every step is int8: kx3 rows on 512-bit
builds, else its Q6_K rewrite) beside Q4_1 / Q8_0 blocks of the same values, int8
activations (the decode path), at a step of 1, 8 and 64 tokens.

Two sizes per format: 16,384 rows ("cache": ~19 MB of Q4_K at k 2048, which stays in a
large L3 but not in L1/L2, so its T=1 column is an L3 stream rate, and the kernel's own
compute speed only at the larger steps) and ``--big-mb`` of rows (default 1.5 GiB of Q8_0:
"dram") that stream from memory as a decode step's weights do. Times are the best of
``--rounds`` rounds of 5 calls (the host is shared).
Weights are random super-blocks (speed does not depend on the values).

    .venv/bin/python benchmarks/bench_kquant_matmul.py [--threads 2] [--rounds 7]

Prints JSON, then a table (G weights/s per format and step size).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _weights(name: str, n: int, k: int, base: dict):
    from radixlm.native.qweights import from_gguf_raw, quantize_q4, quantize_q8, recoded

    tile = n // 4096
    if name == "Q3_K":  # (its rewrite pending: placed as the engine's Arena places it)
        return recoded(name, np.tile(base[name], (tile, 1)))
    if name in ("Q4_K", "Q5_K", "Q6_K"):
        return from_gguf_raw(name, np.tile(base[name], (tile, 1)))
    dense = np.tile(from_gguf_raw("Q4_K", base["Q4_K"]).dequantize(), (tile, 1))
    return quantize_q8(dense) if name == "Q8_0" else quantize_q4(dense)


def time_matmul(lib, w, tokens: int, threads: int, rounds: int, plain: bool = False) -> float:
    """Best seconds per call of the int8 matmul of ``tokens`` tokens against ``w``
    (``plain``: rows in the layout they were given, none repacked)."""
    from radixlm.native import ops
    from radixlm.native.arena import Arena
    from radixlm.native.build import ACT_INT8

    keep: list = []
    if w.pending and not plain:  # (Q3_K: the arena of a model whose every step is int8)
        arena = Arena([w], lib, threads, int8_only=True)
        mat, arrays = arena.place(w)
        keep += [arena, arrays]
    else:
        mat = ops.qmat(w, keep, None if plain else lib)  # (repacked where the engine's are)
    x = torch.randn(tokens, w.k)
    out = torch.empty(tokens, w.n)
    ws = torch.empty(lib.rlm_matmul_workspace_floats(tokens, w.k, threads))

    def call():
        lib.rlm_norm_head(ctypes.byref(mat), None, 1e-5, tokens, x.data_ptr(), out.data_ptr(),
                          ws.data_ptr(), ACT_INT8, threads)

    call()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(5):
            call()
        best = min(best, (time.perf_counter() - t0) / 5)
    return best


def main() -> None:
    from test_native_kquants import kquant_rows

    from radixlm.hostinfo import host_line
    from radixlm.native import build

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--big-mb", type=int, default=1536, help="DRAM-sized matrix (Q8_0 MB)")
    ap.add_argument("--formats", default="Q4_K,Q5_K,Q6_K,Q4_1,Q8_0")
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--plain", default="",
                    help="formats also timed in their plain layout (e.g. Q4_1,Q8_0: what an "
                         "AMX build or a step mix with fp32 / bf16 reads), as FMT-plain rows")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    host = build.host_info()
    print(host_line(host), flush=True)
    lib = build.load()
    if lib is None:
        raise SystemExit("the native library is unavailable on this host: nothing to time")
    k = args.k
    base = {t: kquant_rows(t, 4096, k, seed=3) for t in ("Q3_K", "Q4_K", "Q5_K", "Q6_K")}
    big_n = max(4096, args.big_mb * 2**20 // (k + k // 16) // 4096 * 4096)
    sizes = {"cache": 16384, "dram": big_n}
    results = {"host": host, "k": k, "threads": args.threads, "rows": sizes, "gweights_s": {}}
    names = args.formats.split(",") + [f"{f}-plain" for f in args.plain.split(",") if f]
    for name in names:
        fmt = name.removesuffix("-plain")
        for size, n in sizes.items():
            w = _weights(fmt, n, k, base)
            for t in map(int, args.tokens.split(",")):
                if size == "dram" and t > 8:
                    continue  # (a prefill-sized step is compute-bound: the cache row)
                sec = time_matmul(lib, w, t, args.threads, args.rounds, name != fmt)
                key = f"{name} {size} T={t}"
                results["gweights_s"][key] = n * k * t / sec / 1e9
                print(f"{key}: {sec * 1e3:.2f} ms", flush=True)
            del w
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n{host_line(host)}\nint8 activations, k = {k}, {args.threads} threads; "
          "G weights x tokens / s (best of rounds)")
    cols = [c for c in results["gweights_s"] if c.startswith(names[0] + " ")]
    heads = [c.split(" ", 1)[1] for c in cols]
    print(f"{'format':<10}" + "".join(f"{h:>14}" for h in heads))
    for fmt in names:
        row = [results["gweights_s"].get(f"{fmt} {h}") for h in heads]
        print(f"{fmt:<10}" + "".join(f"{v:>14.1f}" if v else f"{'-':>14}" for v in row))


if __name__ == "__main__":
    main()
