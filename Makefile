# The two commands of the README. Each creates .venv on first use and reuses it after.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test lint bench clean-demo

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	$(VENV)/bin/python -m pip check
	touch $(STAMP)

## demo: the whole pipeline locally on the offline default dataset, served and queried over gRPC.
demo: $(STAMP)
	$(VENV)/bin/ampflow demo --workdir runs/demo

## test: lint, then the whole test suite (a few minutes on 2 cores).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/train_throughput.py --out benchmarks/results
