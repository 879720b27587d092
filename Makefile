# taskport developer commands. Everything runs from .venv, built here with the system python3 (>= 3.11).
#   make up      run the whole service locally (embedded Redis unless REDIS_URL is set)
#   make test    lint, type checks and the whole test suite (Python alone; what CI runs first); on
#                TEST_WORKERS (default 3) parallel workers, then the timing-sensitive tests alone
#   make test-faults  the fault-injection modules: kill -9, SIGTERM and Ctrl-C of real processes, Redis killed
#                and restarted, deploys, failing commands (~9 min; CI runs it after make test)
#   make test-browser  the page and its JS client in headless Chromium (needs the chromium and
#                chromium-driver system packages; CI runs it after make test)
#   make test-fuzz  the live API fuzzed against its own OpenAPI document (schemathesis, ~2 min;
#                CI runs it after make test); TASKPORT_FUZZ_SECONDS sets each run's budget (default 40)
#   make test-docs  the walkthrough, the clients page, the processor guide and README's example run as
#                written against real `taskport up` stacks, their outputs checked (sybil, ~5 min; CI runs it
#                after make test)
#   make test-slow  the tests that take minutes by nature (two schedulers over five minutes of a
#                once-a-minute schedule; callbacks' retries; the edges, operator and batch-client modules);
#                CI runs it after make test
#   make test-soak  the fault soak (tests/soak): `taskport up` under steady load while a seeded nemesis kills,
#                freezes and cuts off its processes and Redis, then a checker of everything acknowledged;
#                TASKPORT_SOAK_SECONDS of faults (default 600, ~11 min in all); CI runs it after make test-slow
#   make test-scale  the multi-host bed (tests/scale: network namespaces, a Redis primary, two replicas,
#                three Sentinels, web and worker hosts): failover and host-loss tests; needs root (CI runs it
#                after make test)
#   make bench   the benchmarks in bench/ (make bench-scale: the scale-out curve on the bed, as root)
#   make lint    ruff and mypy only
#   make clean   remove the venv and caches (var/, the local data, is kept)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A stamp per install flavour: pip runs again only when pyproject.toml is newer than the stamp.
RUNTIME_STAMP := $(VENV)/.installed-runtime
DEV_STAMP := $(VENV)/.installed-dev
LINT_PATHS := app workers clients/python/taskport tests $(wildcard bench)

.PHONY: up test test-faults test-browser test-fuzz test-docs test-slow test-soak test-scale lint bench bench-scale clean

up: $(RUNTIME_STAMP)
	$(BIN)/taskport up

# The suite on TEST_WORKERS pytest-xdist workers (a test file stays on one worker, so a module's shared stack
# starts once), then the tests marked serial alone: they assert durations that contention would stretch.
TEST_WORKERS ?= 3
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial and not slow and not faults"
	$(BIN)/python -m pytest -m "serial and not slow and not faults"

# The fault-injection modules (a whole `taskport up` or stack each, killed, signalled or broken): on one
# worker per core, then their serial tests alone.
test-faults: $(DEV_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "faults and not serial"
	$(BIN)/python -m pytest -m "faults and serial"

# Screenshots land in build/browser/ (docs/page.png is a copy of build/browser/page.png).
test-browser: $(DEV_STAMP)
	$(BIN)/python -m pytest tests/browser

# Two schemathesis runs (with API keys, in open mode) against a real stack, each `--checks all` with the examples,
# coverage, fuzzing and stateful phases: tests/fuzz/test_contract.py.
test-fuzz: $(DEV_STAMP)
	$(BIN)/python -m pytest tests/fuzz

# The pages in reading order (each stands on its own, and they run in this order on shared stacks): tests/docs.
DOC_PAGES := docs/walkthrough.md docs/clients.md docs/processors.md README.md
test-docs: $(DEV_STAMP)
	$(BIN)/python -m pytest -p tests.docs.plugin -p no:xdist --timeout 300 tests/docs $(DOC_PAGES)

# Tests that take minutes of wall time by nature (a schedule watched over five real minutes).
test-slow: $(DEV_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "slow and not serial"
	$(BIN)/python -m pytest -m "slow and serial"

# The soak prints its seed first (TASKPORT_SOAK_SEED replays it) and its figures last (-s: as they happen);
# a run's logs and Redis files stay in build/soak/. Its timeout follows its length (tests/soak/test_soak.py).
test-soak: $(DEV_STAMP)
	$(BIN)/python -m pytest tests/soak -m soak -p no:xdist -s

# One bed per test module, torn down after it (and by the session's first step, if a killed run left one).
test-scale: $(DEV_STAMP)
	$(BIN)/python -m pytest tests/scale -p no:xdist --timeout 600

lint: $(DEV_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy

bench: $(DEV_STAMP)
	$(BIN)/python bench/run.py

# The scale-out curve on the multi-host bed (root: network namespaces): bench/SCALE.md
bench-scale: $(DEV_STAMP)
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info clients/python/*.egg-info build
	find app workers clients tests $(wildcard bench) -name __pycache__ -type d -prune -exec rm -rf {} +

# The venv gets uv first (from PyPI, with pip): it installs the project's dependencies in seconds where pip
# takes about a minute (measured on this machine: 5 s against 54 s for the dev install, the same versions;
# 12 s with --compile-bytecode, which pip does by default and spares every process's first imports), and it
# compiles requirements.txt (make lock).
UV_VERSION := uv>=0.13.8,<0.14
UV_INSTALL := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "taskport needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q '$(UV_VERSION)'

# Both installs are of the lock files, never of pyproject.toml's ranges: what `make up` runs is what `make test`
# and CI tested (and what a deploy installs), and an upstream release changes nothing until `make lock`. The
# project itself goes in editable, its dependencies being the lock's: the service and its client distribution
# (clients/python, taskport-client, which the dev lock leaves out: see make lock).
CLIENT := clients/python
$(RUNTIME_STAMP): pyproject.toml $(CLIENT)/pyproject.toml requirements.txt | $(BIN)/python
	$(UV_INSTALL) -r requirements.txt
	$(UV_INSTALL) --no-deps -e $(CLIENT) -e .
	touch $@

# The dev lock holds the runtime one's pins too, so the dev install refreshes both stamps.
$(DEV_STAMP): pyproject.toml $(CLIENT)/pyproject.toml requirements-dev.txt | $(BIN)/python
	$(UV_INSTALL) -r requirements-dev.txt
	$(UV_INSTALL) --no-deps -e $(CLIENT) -e .
	touch $@ $(RUNTIME_STAMP)

# The lock files, exact pins compiled by uv from pyproject.toml (tests/unit/test_lock.py fails when they
# disagree with it or with each other): requirements-dev.txt, the runtime and dev dependencies resolved
# together, then requirements.txt (what a Heroku-style Python buildpack installs) within its pins. Run after
# changing the dependencies: uv keeps every pin that still fits; delete both files first to take the newest
# releases. The client distribution (taskport-client, from clients/python by pyproject's [tool.uv.sources]) is
# resolved with the rest, its dependencies pinned in both; requirements.txt installs it (`-e clients/python`, as a
# buildpack runs it from the checkout), the dev lock leaves the line out: uv takes no path as a constraint.
LOCK_PYTHON := $(shell cat .python-version)
LOCK := $(BIN)/uv pip compile pyproject.toml --quiet --python-version $(LOCK_PYTHON) --python-platform linux \
	--custom-compile-command 'make lock'
.PHONY: lock
lock: | $(BIN)/python
	$(LOCK) --extra dev --no-emit-package taskport-client --output-file requirements-dev.txt
	$(LOCK) --constraint requirements-dev.txt --output-file requirements.txt

# The Procfile as a Heroku-style platform runs it, here: honcho with the venv's bin first on PATH, so the
# Procfile's `python` is the venv's (honcho runs each line through /bin/sh with the caller's PATH).
.PHONY: procfile
procfile: $(RUNTIME_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start
