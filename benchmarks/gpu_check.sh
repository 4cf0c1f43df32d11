#!/usr/bin/env bash
# One command on a lent GPU machine: kernel tests on CUDA, kernel roofline table, e2e triton vs
# torch. Results: $OUT/gpu_check.json (or ./gpu_check.json), pytest.log beside it.
# Python: $PYTHON if set, else the repo's .venv, else python3 (needs torch with CUDA + triton).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PY" benchmarks/gpu_check.py "$@"
