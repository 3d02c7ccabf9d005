# The project's commands. `make test` and `make demo` work on a fresh machine with nothing prepared by hand.
SHELL := /bin/bash
UV_VERSION := 0.13.9
BOOTSTRAP := .var/bootstrap
UV := $(BOOTSTRAP)/bin/uv
VENV := .venv
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := python3
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: install services-up services-down services-status lint test bench demo clean

# uv itself comes from PyPI into a private venv; everything else is installed from uv.lock, exactly.
$(UV):
	python3 -m venv $(BOOTSTRAP)
	$(BOOTSTRAP)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

install: $(UV)
	$(UV) sync --frozen --quiet --compile-bytecode  # bytecode at install: imports stay fast even with PYTHONDONTWRITEBYTECODE

services-up:
	bash deploy/local/services.sh up

services-down:
	bash deploy/local/services.sh down

services-status:
	bash deploy/local/services.sh status

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: install services-up lint
	$(VENV)/bin/pytest

bench: install services-up
	$(VENV)/bin/python -m tests.benchmarks.bench_extract
	$(VENV)/bin/python -m tests.benchmarks.bench_store
	$(VENV)/bin/python -m tests.benchmarks.bench_recall
	$(VENV)/bin/python -m tests.benchmarks.bench_recall_quality
	$(VENV)/bin/python -m tests.benchmarks.bench_ingest
	$(VENV)/bin/python -m tests.benchmarks.bench_queue_bytes
	$(VENV)/bin/python -m tests.benchmarks.bench_crash_recovery
	$(VENV)/bin/python -m tests.benchmarks.bench_llm_latency
	$(VENV)/bin/python -m tests.benchmarks.bench_freshness
	$(VENV)/bin/python -m tests.benchmarks.bench_portability

demo: install services-up
	$(VENV)/bin/python deploy/demo/run_demo.py

clean: services-down
	rm -rf .var $(VENV) deploy/neo4j/target
