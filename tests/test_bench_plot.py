"""benchmarks/plot.py reads each benchmark's JSON the way the benchmark writes it (the
shapes below are cut-down `--out` files) and draws the four plots."""

from __future__ import annotations

import json
from pathlib import Path

import plot  # benchmarks/ is on sys.path (conftest)
import pytest

HOST = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "isa": ["avx2", "avx512f"]}
VS_LLAMA = {"host": HOST, "llama_cpp": {}, "radixlm": {},
            "ratio_median": {"single_decode_tok_s": 1.1, "ttft_s": 6.0, "prefill_tok_s": 7.0},
            "ratio_per_round": [{"single_decode_tok_s": 1.0, "ttft_s": 5.0, "prefill_tok_s": 7.0},
                                {"single_decode_tok_s": 1.2, "ttft_s": 7.0, "prefill_tok_s": 7.0}]}
OFFLINE = {"host": {**HOST, "isa": ["avx2"]}, "config": {"batches": []},
           "radixlm": {"single_decode_tok_s": 100.0, "prefill_tok_s": 2000.0,
                       "batch4_equal_tok_s": 80.0, "batch4_mixed_tok_s": 90.0,
                       "batch16_equal_tok_s": 300.0, "batch16_mixed_tok_s": 320.0,
                       "batch16_equal_ttft_p50_s": 0.5},
           "hf_transformers": {"batch4_equal_tok_s": 20.0, "batch4_mixed_tok_s": 25.0,
                               "batch16_equal_tok_s": 100.0, "batch16_mixed_tok_s": 110.0},
           "speedup": {"single_decode_tok_s": 6.0, "prefill_tok_s": 1.3,
                       "batch16_equal_tok_s": 3.0, "batch16_mixed_tok_s": 2.9},
           "speedup_per_round": [{"single_decode_tok_s": 6.0, "prefill_tok_s": 1.3,
                                  "batch16_equal_tok_s": 3.0, "batch16_mixed_tok_s": 2.9}]}
STEP = {"step_ms": 40.0, "linears_ms": 20.0, "attention_ms": 5.0, "rest_ms": 15.0}
DECODE = {"host": HOST, "context": 256, "reference_path": "torch bf16",
          "reference": {"1": {**STEP, "step_ms": 100.0}, "16": {**STEP, "step_ms": 200.0}},
          "native": {"1": STEP, "16": {**STEP, "step_ms": 50.0}}}


def prefix(size: int, hit: float) -> dict:
    on = {"hit_rate": hit, "optimal_hit_rate": 0.7}
    return {"host": HOST, "config": {"max_total_tokens": size}, "workloads": {
        "multi_turn_chat": {"radix_on": on, "radix_off": {"hit_rate": 0.0}},
        "no_sharing": {"radix_on": {"hit_rate": 0.0, "optimal_hit_rate": 0.0}}}}


def test_each_benchmarks_json_is_read_as_it_is_written() -> None:
    assert [plot.kind_of(r) for r in (VS_LLAMA, OFFLINE, DECODE, prefix(1, 0.1))] == [
        "vs_llamacpp", "offline", "decode_step", "prefix"]
    with pytest.raises(ValueError, match="not the JSON"):
        plot.kind_of({"host": HOST})
    rows = plot.headline_rows([VS_LLAMA, OFFLINE])
    assert set(rows) == {"Intel Xeon, 2 cores, AVX-512", "Intel Xeon, 2 cores, AVX2"}
    llama = rows["Intel Xeon, 2 cores, AVX-512"]
    assert llama[0] == ("single-stream decode", "llama.cpp", 1.1, [1.0, 1.2])
    hf = dict((m, (med, per)) for m, _, med, per in rows["Intel Xeon, 2 cores, AVX2"])
    assert hf["batch 16, mixed lengths"] == (2.9, [2.9]) and "batch 4, equal lengths" not in hf
    lines = plot.throughput_points([OFFLINE, DECODE])
    assert lines["radixlm, mixed lengths, end to end (Intel Xeon, 2 cores, AVX2)"] == [
        (4, 90.0), (16, 320.0)]
    assert lines["native decode steps alone (Intel Xeon, 2 cores, AVX-512)"] == [
        (1, 25.0), (16, 320.0)]
    assert plot.hit_rate_points([prefix(4096, 0.6), prefix(1024, 0.1)]) == {
        "multi_turn_chat": [(1024, 0.1, 0.7), (4096, 0.6, 0.7)]}


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is a benchmark-only dependency "
                                             "(pip install -e '.[plot]')")
    files = []
    for i, r in enumerate([VS_LLAMA, OFFLINE, DECODE, prefix(1024, 0.1), prefix(4096, 0.6)]):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(r))
    assert plot.main([*map(str, files), "--out-dir", str(tmp_path / "img"), "--note", "x"]) == 0
    for name in ("headline", "decode_step", "throughput_batch", "prefix_hit_rate"):
        png = (tmp_path / "img" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name
