"""Native memory kept per distinct matmul shape (the soak's RSS growth, issue 23).

A bf16 ``F.linear`` on the CPU goes through oneDNN, which keeps state for every new row
count (token count) it sees; the torch model path runs with a new token count on most
prefill steps. This measures glibc malloc's in-use bytes (``mallinfo2``: heap + mmapped
chunks) after a run over ``--shapes`` new row counts and after repeating the same ones,
with oneDNN on and off, and with oneDNN on at the row counts the torch path runs
(``models/quant.py: gemm_rows``, rounded up), for SmolLM2-135M's projection shapes.

Prints the host line, a table and a JSON summary (``--json PATH``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys

from radixlm.native.build import host_info, host_line

_CHILD = r"""
import ctypes, json, sys, torch, torch.nn.functional as F
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
def used():
    m = libc.mallinfo2(); return (m.uordblks + m.hblkhd) / 1e6
torch.backends.mkldnn.enabled = sys.argv[1] != "0"
lo, n = int(sys.argv[2]), int(sys.argv[3])
if sys.argv[1] == "rounded":
    from radixlm.runtime.models.quant import gemm_rows
else:
    def gemm_rows(m): return m
w = [torch.randn(o, 576, dtype=torch.bfloat16) for o in (576, 1536, 192)]
def run(rows):
    for m in rows:
        x = torch.randn(gemm_rows(m), 576, dtype=torch.bfloat16)
        for wi in w: F.linear(x, wi)
run(range(lo - 10, lo))
a = used(); run(range(lo, lo + n)); b = used(); run(range(lo, lo + n)); c = used()
print(json.dumps({"new_shapes_mb": round(b - a, 1), "repeat_mb": round(c - b, 1)}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=int, default=400, help="new row counts (65 upwards)")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args()
    if not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"):
        sys.exit("needs glibc >= 2.33 (mallinfo2)")
    print(host_line())
    rows = {}
    for name, flag in (("onednn", "1"), ("aten", "0"), ("rounded", "rounded")):
        out = subprocess.check_output([sys.executable, "-c", _CHILD, flag, "65",
                                       str(args.shapes)], text=True)
        rows[name] = json.loads(out.strip().splitlines()[-1])
    print(f"{'path':<8} {'new shapes MB':>14} {'repeat MB':>10}  ({args.shapes} row counts "
          "x 3 weights)")
    for name, r in rows.items():
        print(f"{name:<8} {r['new_shapes_mb']:>14} {r['repeat_mb']:>10}")
    summary = {"host": host_info(), "shapes": args.shapes, **rows}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
