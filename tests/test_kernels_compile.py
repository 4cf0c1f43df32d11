"""Every Triton kernel compiles for sm_90 (H100/H200) ahead of time, on any machine.

The interpreter tests check what the kernels compute; this checks what only the compiler
sees (types of compiled control flow, ``tl.dot`` shape limits, shared memory). It runs in a
subprocess because the kernel tests turn on ``TRITON_INTERPRET`` for this process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = ("from kernel_testing import compile_kernels_for_gpu\n"
          "print('\\n'.join(compile_kernels_for_gpu(arch=90, dtypes=('bf16',))))")


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None,
                    reason="triton without its NVIDIA backend")
def test_all_kernels_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]  # kernel_testing
    env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiled = proc.stdout.split("\n")
    names = {line.split()[0] for line in compiled if line}
    assert names == {"_decode_stage1_kernel", "_decode_stage2_kernel", "_extend_kernel",
                     "_rotary_kernel", "_store_kv_kernel", "_store_kv_int8_kernel",
                     "_rmsnorm_kernel",
                     "_silu_and_mul_kernel", "_bitmask_kernel"}, compiled
