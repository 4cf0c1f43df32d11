"""The bounded variant of the standing stress suite (`benchmarks/stress.py --quick`) against
a real `radixlm serve` on 127.0.0.1 with the tiny random model: no 5xx anywhere, every bad
input refused as catalogued, every 429 with Retry-After, no request or KV slot held after
idle (the slot-accounting invariant seen from outside), SIGTERM under load exits 0 with
every stream finished. Speed figures are printed by the suite, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_stress_quick(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "stress.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "stress.py"), "--quick",
           "--model", str(tiny_model_dir), "--cases", "50", "--duration", "3",
           "--overload-duration", "2", "--request-timeout", "60", "--json", str(out),
           "--server-log", str(tmp_path / "server.log")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    phases = report["phases"]
    assert set(phases) == {"bad inputs", "schemathesis", "streaming", "overload 2x"}
    for name, s in phases.items():
        assert s["s5xx"] == 0, (name, s["samples"])
        assert s["r429"] == s["r429_retry_after"], name
        assert s["transport_errors"] == 0 and s["inband_errors"] == 0, (name, s["samples"])
    assert report["bad_input_mismatches"] == []
    assert phases["schemathesis"]["cases"] >= 30
    for name in ("streaming", "overload 2x"):
        assert phases[name]["other_errors"] == 0, phases[name]["samples"]
        assert phases[name]["completed"] > 0
    assert phases["streaming"]["disconnects"] > 0
    assert report["idle"]["requests_left"] == 0
    assert report["idle"]["kv_held_by_requests"] == 0
    sigterm = report["sigterm"]
    assert sigterm["exit_code"] == 0 and sigterm["finished_with_done"] == sigterm["streams"]
