"""`make bench` and the constraint benchmark run to their end in their smallest settings.

Both reach into the engine (the scheduler's per-step grammar masks; transformers' reference
load of the served model) and both once failed unnoticed when those moved. Speed is not
checked here (targets live in the benchmarks); what they report is: every system measured,
every constrained output valid JSON, the mask hook timing real steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, tmp_path: Path) -> dict:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick",
                           "--rounds", "1", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_bench_offline_measures_both_systems(tmp_path):
    res = _run("bench_offline.py", tmp_path)
    for system in ("radixlm", "hf_transformers"):
        assert res[system]["single_decode_tok_s"] > 0 and res[system]["prefill_tok_s"] > 0
    assert set(res["speedup"]) == set(res["hf_transformers"])


def test_bench_constrained_times_the_masks_of_valid_documents(tmp_path):
    res = _run("bench_constrained.py", tmp_path)
    for batch, n in (("batch1", 1), ("batch16", 16)):
        assert res[batch]["valid_json"] == f"{n}/{n}"
        assert res[batch]["mask_fill_ms_per_step"] > 0  # (the hook saw constrained steps)
    for variant in ("jump_forward", "jump_forward_compact", "jump_forward_optional_space"):
        assert res[variant]["valid_on"] == res[variant]["valid_off"] == 4
    assert res["compile"]["compiled"] == res["compile"]["total"] > 0
