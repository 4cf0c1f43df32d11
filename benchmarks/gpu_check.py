"""One command for a lent GPU machine: kernel tests, kernel speed against the roofline, e2e.

    python benchmarks/gpu_check.py [--out PATH] [--skip-tests] [--skip-e2e] [--budget-s 450]

1. ``pytest tests/test_kernels*.py`` on CUDA (the Triton kernels against their torch twins,
   the AOT sm_90 build, the Engine on the Triton path against the torch path).
2. Each Triton kernel against its torch twin (``radixlm.kernels.ref``): median time, achieved
   GB/s and TFLOP/s next to the device peak. Target: decode attention at long contexts
   >= 70% of HBM bandwidth.
3. The Engine on the default model at batch 64, ``attention_backend="triton"`` vs
   ``"torch"``, each in its own subprocess with a timeout. Target: triton >= 2x torch.

Writes JSON to ``--out`` (default ``$OUT/gpu_check.json``, else ``./gpu_check.json``) and
prints a table. Without CUDA it says so, writes ``{"status": "no_cuda"}`` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (HBM bytes/s, dense bf16 FLOP/s) by device-name substring; the first match wins.
PEAKS = [("H200", 4.8e12, 989e12), ("H100", 3.35e12, 989e12), ("A100", 2.0e12, 312e12)]
E2E_PROMPTS, E2E_NEW_TOKENS = 64, 256
DEVICE = "cuda"  # a module constant so the case builders can be smoke-tested on the CPU
Case = tuple[str, Callable[[], object], Callable[[], object], float, float]


def device_peaks() -> tuple[str, float | None, float | None]:
    name = torch.cuda.get_device_name()
    for key, bandwidth, flops in PEAKS:
        if key in name:
            return name, bandwidth, flops
    return name, None, None


def run_kernel_tests(timeout_s: float, log_path: Path) -> dict:
    tests = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_kernels*.py"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra", *tests]
    start = time.time()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        log, rc = f"{exc.stdout or ''}\nTIMEOUT after {timeout_s:.0f}s", -1
    log_path.write_text(log if isinstance(log, str) else log.decode(errors="replace"))
    summary = [line for line in log.splitlines() if " passed" in line or " failed" in line]
    return {"returncode": rc, "ok": rc == 0, "summary": summary[-1] if summary else log[-500:],
            "seconds": round(time.time() - start, 1), "log": str(log_path)}


def _pool(batch: int, context: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """Contiguous slots per request (as the engine allocates where it can)."""
    shape = (batch * context, kv_heads, head_dim)
    k = torch.randn(shape, device=DEVICE, dtype=dtype)
    v = torch.randn(shape, device=DEVICE, dtype=dtype)
    r2t = torch.arange(batch * context, device=DEVICE, dtype=torch.int32).view(batch, context)
    return k, v, r2t


def _with_config(module, config, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with ``module.CONFIG_OVERRIDE = config`` (a launch-shape sweep)."""
    if config is None:
        return fn

    def run() -> object:
        module.CONFIG_OVERRIDE = config
        try:
            return fn()
        finally:
            module.CONFIG_OVERRIDE = None

    return run


def decode_case(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                splits: int | None = None, config=None,
                dtype: torch.dtype = torch.bfloat16, kv_int8: bool = False) -> Case:
    """``kv_int8``: the pool int8 with its bf16 row scales (``--kv-cache-dtype int8``)."""
    from radixlm.kernels import attention_decode, ref

    k, v, r2t = _pool(batch, context, kv_heads, head_dim, dtype)
    scales: tuple = ()
    if kv_int8:
        (k, k_scale), (v, v_scale) = ref.quantize_kv(k), ref.quantize_kv(v)
        scales = (k_scale, v_scale)
    q = torch.randn(batch, heads, head_dim, device=DEVICE, dtype=dtype)
    rows = torch.arange(batch, device=DEVICE)
    seq_lens = torch.full((batch,), context, device=DEVICE)
    args = (q, k, v, r2t, rows, seq_lens, head_dim**-0.5, *scales)
    tokens = batch * context
    row_bytes = head_dim * k.element_size() + (2 if kv_int8 else 0)  # + a bf16 scale
    nbytes = 2 * tokens * kv_heads * row_bytes + tokens * 4
    flops = 4.0 * tokens * heads * head_dim
    kind = "decode int8" if kv_int8 else "decode"  # (the first 5 words key the twin's time)
    label = f"{kind} B{batch} L{context} H{heads}/{kv_heads} D{head_dim}"
    if splits is not None:
        label += f" splits={splits}"
    if config is not None:
        label += f" n{config.block_n}w{config.num_warps}s{config.num_stages}"
    run = _with_config(attention_decode, config, lambda: attention_decode.decode_attention(
        *args, num_kv_splits=splits, max_seq_len=context))
    return label, run, lambda: ref.decode_attention(*args), nbytes, flops


def extend_case(batch: int, prefix: int, extend: int, heads: int, kv_heads: int,
                head_dim: int, config=None, dtype: torch.dtype = torch.bfloat16) -> Case:
    from radixlm.kernels import attention_extend, ref

    k, v, r2t = _pool(batch, prefix + extend, kv_heads, head_dim, dtype)
    q = torch.randn(batch * extend, heads, head_dim, device=DEVICE, dtype=dtype)
    rows = torch.arange(batch, device=DEVICE)
    prefix_lens = torch.full((batch,), prefix, device=DEVICE)
    extend_lens = torch.full((batch,), extend, device=DEVICE)
    args = (q, k, v, r2t, rows, prefix_lens, extend_lens, head_dim**-0.5)
    keys_seen = batch * sum(prefix + i + 1 for i in range(extend))
    flops = 4.0 * keys_seen * heads * head_dim
    nbytes = (2 * batch * (prefix + extend) * kv_heads * head_dim * k.element_size()
              + 2 * q.numel() * q.element_size())
    label = f"extend B{batch} P{prefix}+E{extend} H{heads}/{kv_heads} D{head_dim}"
    if config is not None:
        label += f" m{config.block_m}n{config.block_n}w{config.num_warps}s{config.num_stages}"
    run = _with_config(attention_extend, config, lambda: attention_extend.extend_attention(
        *args, max_extend_len=extend))
    return label, run, lambda: ref.extend_attention(*args), nbytes, flops


def elementwise_cases(tokens: int = 8192, hidden: int = 4096, ffn: int = 14336,
                      vocab: int = 128256, dtype: torch.dtype = torch.bfloat16) -> list[Case]:
    from radixlm.kernels import activation, bitmask, kv_store, norm, ref, rotary

    dev = DEVICE
    x = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device=dev, dtype=dtype)
    gate_up = torch.randn(tokens, 2 * ffn, device=dev, dtype=dtype)
    heads, kv_heads, head_dim = 32, 8, 128
    q = torch.randn(tokens, heads, head_dim, device=dev, dtype=dtype)
    k = torch.randn(tokens, kv_heads, head_dim, device=dev, dtype=dtype)
    inv_freq = 1.0 / (500000 ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
    cos, sin = ref.rotary_cos_sin(torch.arange(tokens, device=dev), inv_freq, dtype)
    k_cache = torch.empty(4 * tokens, kv_heads, head_dim, device=dev, dtype=dtype)
    v_cache = torch.empty_like(k_cache)
    loc = torch.randperm(4 * tokens, device=dev)[:tokens]
    rows = 64
    logits = torch.randn(rows, vocab, device=dev)
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, (vocab + 31) // 32), device=dev,
                         dtype=torch.int32)
    e = x.element_size()
    kv_bytes = 2 * 2 * k.numel() * e + tokens * 8
    return [
        (f"rmsnorm+residual T{tokens} N{hidden}", lambda: norm.rmsnorm(x, w, 1e-6, res),
         lambda: ref.rmsnorm(x, w, 1e-6, res), 4.0 * x.numel() * e, 0.0),
        (f"silu_and_mul T{tokens} F{ffn}", lambda: activation.silu_and_mul(gate_up),
         lambda: ref.silu_and_mul(gate_up), 1.5 * gate_up.numel() * e, 0.0),
        (f"apply_rotary T{tokens} H{heads}/{kv_heads} D{head_dim}",
         lambda: rotary.apply_rotary(q, k, cos, sin), lambda: ref.apply_rotary(q, k, cos, sin),
         2.0 * (q.numel() + k.numel()) * e + 2 * cos.numel() * e, 0.0),
        (f"store_kv T{tokens} Hkv{kv_heads} D{head_dim}",
         lambda: kv_store.store_kv(k_cache, v_cache, loc, k, k),
         lambda: ref.store_kv(k_cache, v_cache, loc, k, k), kv_bytes, 0.0),
        (f"token_bitmask B{rows} V{vocab} fp32",
         lambda: bitmask.apply_token_bitmask(logits, mask),
         lambda: ref.apply_token_bitmask(logits, mask),
         logits.numel() * 4.0 + mask.numel() * 4.0, 0.0),  # upper bound: every logit written
    ]


def decode_sweep() -> list[Case]:
    from radixlm.kernels.attention_decode import LaunchConfig

    shapes = [(32, 4, 2), (32, 8, 2), (64, 4, 2), (64, 8, 2), (32, 4, 3), (128, 8, 2)]
    return [decode_case(8, 32768, 32, 8, 128, config=LaunchConfig(*s)) for s in shapes]


def extend_sweep() -> list[Case]:
    from radixlm.kernels.attention_extend import LaunchConfig

    shapes = [(64, 64, 4), (64, 64, 8), (128, 64, 8), (128, 32, 8), (64, 32, 4)]
    return [extend_case(4, 1024, 1024, 32, 8, 128, config=LaunchConfig(*s)) for s in shapes]


def bench_kernels(peak_bw: float | None, peak_flops: float | None, deadline: float) -> list:
    from triton.testing import do_bench

    def ms(fn: Callable[[], object]) -> float:
        return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))

    builders: list[tuple[str, Callable[[], list[Case]]]] = [
        ("elementwise", elementwise_cases),
        ("decode smollm", lambda: [decode_case(64, 1024, 9, 3, 64)]),  # SmolLM2-135M heads
        ("decode B64", lambda: [decode_case(64, 4096, 32, 8, 128)]),
        ("decode int8 KV", lambda: [decode_case(64, 1024, 9, 3, 64, kv_int8=True),
                                    decode_case(64, 4096, 32, 8, 128, kv_int8=True)]),
        ("decode long", lambda: [decode_case(8, 32768, 32, 8, 128, splits=s)
                                 for s in (None, 4, 8, 16, 32)]),
        ("extend prefix", lambda: [extend_case(4, 1024, 1024, 32, 8, 128)]),
        ("extend prefill", lambda: [extend_case(1, 0, 4096, 32, 8, 128)]),
        ("decode launch sweep", decode_sweep),
        ("extend launch sweep", extend_sweep),
    ]
    results, twin_ms_by_shape = [], {}
    for label, build in builders:
        if time.time() > deadline:
            results.append({"name": f"{label} and later", "skipped": "time budget"})
            break
        try:
            for name, triton_fn, twin_fn, nbytes, flops in build():
                t_ms = ms(triton_fn)
                shape = " ".join(name.split()[:5])  # the label without split/launch suffixes
                if shape not in twin_ms_by_shape:
                    twin_ms_by_shape[shape] = ms(twin_fn)
                twin_ms = twin_ms_by_shape[shape]
                gbps, tflops = nbytes / t_ms / 1e6, flops / t_ms / 1e9
                results.append({
                    "name": name, "triton_ms": t_ms, "twin_ms": twin_ms,
                    "speedup": twin_ms / t_ms, "GB/s": gbps, "TFLOP/s": tflops,
                    "hbm_pct": 100 * gbps * 1e9 / peak_bw if peak_bw else None,
                    "flops_pct": 100 * tflops * 1e12 / peak_flops if peak_flops and flops else None,
                })
            torch.cuda.empty_cache()
        except Exception as exc:  # report and go on: one broken kernel must not hide the rest
            results.append({"name": label, "error": repr(exc)[:500]})
    return results


def e2e_worker(backend: str, model: str, out_path: str, device: str = "cuda",
               num_prompts: int = E2E_PROMPTS, new_tokens: int = E2E_NEW_TOKENS) -> None:
    """Child process: one Engine, ``num_prompts`` greedy requests at once, output tokens/s."""
    from radixlm.runtime.engine import Engine

    prompts = [f"Write a short story about robot number {i} and its favourite colour."
               for i in range(num_prompts)]
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    load_start = time.time()
    engine = Engine(model=model, attention_backend=backend, device=device, dtype="bfloat16",
                    max_running_requests=num_prompts, log_level="warning")
    load_s = time.time() - load_start
    try:
        engine.generate([f"Warm-up {i}: say hello." for i in range(8)],
                        {"max_new_tokens": 16, "temperature": 0})
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.time()
        outs = engine.generate(prompts, params)
        seconds = time.time() - start
    finally:
        engine.shutdown()
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    Path(out_path).write_text(json.dumps({
        "backend": backend, "load_s": load_s, "seconds": seconds,
        "completion_tokens": completion, "prompt_tokens": sum(
            o["meta_info"]["prompt_tokens"] for o in outs),
        "output_tok_per_s": completion / seconds, "output_ids": [o["output_ids"] for o in outs],
    }))


def run_e2e(model: str, timeout_s: float, work_dir: Path) -> dict:
    runs: dict[str, dict] = {}
    for backend in ("triton", "torch"):
        out_path = work_dir / f"e2e_{backend}.json"
        cmd = [sys.executable, __file__, "--e2e-worker", backend, "--model", model,
               "--out", str(out_path)]
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(REPO)})
            if proc.returncode != 0 or not out_path.exists():
                runs[backend] = {"error": (proc.stdout + proc.stderr)[-3000:]}
                continue
            runs[backend] = json.loads(out_path.read_text())
        except subprocess.TimeoutExpired:
            runs[backend] = {"error": f"timeout after {timeout_s:.0f}s"}
    result: dict = {b: {k: v for k, v in r.items() if k != "output_ids"} for b, r in runs.items()}
    if all("output_tok_per_s" in r for r in runs.values()):
        ratio = runs["triton"]["output_tok_per_s"] / runs["torch"]["output_tok_per_s"]
        pairs = list(zip(runs["triton"]["output_ids"], runs["torch"]["output_ids"], strict=True))
        same = sum(a == b for a, b in pairs)
        result.update(speedup=ratio, target_2x_met=ratio >= 2.0,
                      identical_greedy_outputs=f"{same}/{len(pairs)}")
    return result


def print_report(report: dict) -> None:
    print(f"\n== {report['device']}  (peaks: {report['peak_hbm_GBps']} GB/s, "
          f"{report['peak_bf16_TFLOPs']} TFLOP/s)")
    tests = report.get("tests")
    if tests:
        print(f"kernel tests: {'OK' if tests['ok'] else 'FAILED'} - {tests['summary']}")
    header = f"{'kernel':44s} {'triton ms':>10s} {'twin ms':>10s} {'x':>7s} {'GB/s':>8s} "
    print(header + f"{'%HBM':>6s} {'TFLOP/s':>8s} {'%peak':>6s}")
    for row in report.get("kernels", []):
        if "triton_ms" not in row:
            print(f"{row['name']:44s} {row.get('error') or row.get('skipped')}")
            continue
        hbm = f"{row['hbm_pct']:.0f}" if row["hbm_pct"] is not None else "-"
        fl = f"{row['flops_pct']:.0f}" if row["flops_pct"] is not None else "-"
        print(f"{row['name']:44s} {row['triton_ms']:10.3f} {row['twin_ms']:10.3f} "
              f"{row['speedup']:7.1f} {row['GB/s']:8.0f} {hbm:>6s} {row['TFLOP/s']:8.1f} {fl:>6s}")
    for name, value in report.get("targets", {}).items():
        print(f"target {name}: {value}")
    if "e2e" in report:
        print("e2e:", json.dumps(report["e2e"], indent=1, default=str))


def targets(report: dict) -> dict:
    decode_long = [r for r in report.get("kernels", [])
                   if r.get("name", "").startswith("decode B8 L32768") and r.get("hbm_pct")]
    out: dict = {}
    if decode_long:
        best = max(r["hbm_pct"] for r in decode_long)
        auto = next((r["hbm_pct"] for r in decode_long if "splits" not in r["name"]), None)
        out["decode_long_context_hbm_pct_>=70"] = {
            "auto_splits": auto, "best_splits": best, "met": (auto or 0) >= 70}
    e2e = report.get("e2e", {})
    if "speedup" in e2e:
        out["e2e_triton_vs_torch_>=2x"] = {"speedup": e2e["speedup"], "met": e2e["speedup"] >= 2}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/gpu_check.json)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--budget-s", type=float, default=450.0, help="overall time budget")
    parser.add_argument("--e2e-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--e2e-device", default="cuda", help=argparse.SUPPRESS)  # smoke tests
    parser.add_argument("--e2e-prompts", type=int, default=E2E_PROMPTS, help=argparse.SUPPRESS)
    parser.add_argument("--e2e-new-tokens", type=int, default=E2E_NEW_TOKENS,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.e2e_worker:
        e2e_worker(args.e2e_worker, args.model, args.out, args.e2e_device, args.e2e_prompts,
                   args.e2e_new_tokens)
        return 0

    start = time.time()
    out_path = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False). This script "
              "needs a GPU; on the CPU run `pytest tests/test_kernels.py "
              "tests/test_kernels_attention.py` (Triton interpreter).", file=sys.stderr)
        out_path.write_text(json.dumps({"status": "no_cuda"}))
        return 2

    name, peak_bw, peak_flops = device_peaks()
    report: dict = {"status": "ok", "device": name, "torch": torch.__version__,
                    "peak_hbm_GBps": peak_bw and peak_bw / 1e9,
                    "peak_bf16_TFLOPs": peak_flops and peak_flops / 1e12}
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    if not args.skip_tests:
        print("running kernel tests on CUDA ...", flush=True)
        report["tests"] = run_kernel_tests(0.35 * args.budget_s, out_path.parent / "pytest.log")
    print("benchmarking kernels ...", flush=True)
    report["kernels"] = bench_kernels(peak_bw, peak_flops, start + 0.6 * args.budget_s)
    left = args.budget_s - (time.time() - start)
    if not args.skip_e2e and left > 60:
        print("end-to-end engine runs ...", flush=True)
        torch.cuda.empty_cache()
        report["e2e"] = run_e2e(args.model, left / 2 - 5, out_path.parent)
    elif not args.skip_e2e:
        report["e2e"] = {"skipped": f"only {left:.0f}s of the budget left"}
    report["targets"] = targets(report)
    report["seconds"] = round(time.time() - start, 1)
    out_path.write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"\nwrote {out_path} ({report['seconds']}s)")
    return 0 if report.get("tests", {"ok": True})["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
