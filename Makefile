# Airlock: `make run` (the dashboard on the embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The MCP conformance suite, the MCP Inspector and their Node (`make conformance`, below).
CONFORMANCE := .conformance
CONFORMANCE_STAMP := $(CONFORMANCE)/.installed

.PHONY: run test check bench bench-compare install migrate clean chaos conformance

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# The Python client of the decision API (its own distribution, no Django): editable,
	# for the tests in tests/external that talk to a live server through it.
	$(PY) -m pip install --quiet -e clients/python
	touch $(STAMP)

install: $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

# migrate, then the demo data (seed), static files into var/static (whitenoise serves
# them; the server runs with DEBUG off), then scripts/run.py: web + worker + beat in the
# foreground, each restarted with a back-off if it dies; Ctrl-C stops all three.
# The port is checked first: a second `make run` on a busy port says so in one line and
# starts nothing (no migrate, no worker or beat on the shared broker).
run: port-free seed
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) scripts/run.py

.PHONY: port-free
port-free: $(STAMP)
	@$(PY) scripts/run.py --check-port

test: $(STAMP) $(CONFORMANCE_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: the tests that start no process, server or browser (markers process,
# worker, e2e: tests/processes.py), on every core (pytest-xdist), each worker on its own
# database (SQLite under var/ by default; with DATABASE_URL set, PostgreSQL databases
# suffixed _gw0, _gw1...). `make test` and CI still run everything.
CHECK_WORKERS ?= auto
check: $(STAMP)
	$(PY) -m pytest -m "not process" -n $(CHECK_WORKERS) -q $(PYTEST_ARGS)

# The official MCP conformance suite, the MCP Inspector (tests/gateway/test_inspector.py)
# and the Node 22 they need (the `node` npm package
# ships the binary: nothing is downloaded outside the npm registry), pinned by
# tests/gateway/conformance/package-lock.json, in .conformance/ for
# tests/gateway/test_conformance.py (docs/gateway.md, "Conformance"). Needs npm (any
# Node runs the install); `make test` installs it when missing or changed.
$(CONFORMANCE_STAMP): tests/gateway/conformance/package.json tests/gateway/conformance/package-lock.json
	rm -rf $(CONFORMANCE)
	mkdir -p $(CONFORMANCE)
	cp tests/gateway/conformance/package.json tests/gateway/conformance/package-lock.json $(CONFORMANCE)/
	cd $(CONFORMANCE) && npm ci --no-audit --no-fund --loglevel=error
	$(CONFORMANCE)/node_modules/.bin/node --version
	touch $@

conformance: $(CONFORMANCE_STAMP)

# PostgreSQL (and, for the worker figures, Redis) on localhost; writes bench/results.json.
# The grouped queue and batch decisions: bench/batch.py (key "batch").
# The purge figures (bench/retention.py) seed 100,000 runs: BENCH_PURGE_RUNS=0 skips them.
# The review statistics (bench/stats.py) seed 100,000 decided approvals and 1.2M
# transitions: BENCH_STATS_APPROVALS sets the size (0 skips them).
# bench/gateway.py: the MCP gateway against direct (and against bench/sdk_proxy.py, the
# SDK alone), the decision API's round trip and
# 50 clients waiting for approval (docs/gateway.md).
# bench/history.py: a proposal under five history rules against none, at 100,000 recorded
# calls (BENCH_HISTORY_CALLS, BENCH_HISTORY_SAMPLES; docs/performance.md).
bench: $(STAMP)
	$(PY) bench/run.py
	$(PY) bench/batch.py
	$(PY) bench/caching.py
	$(PY) bench/gateway.py
	$(PY) bench/retention.py
	$(PY) bench/stats.py
	$(PY) bench/history.py

# The same scripted agent on LangGraph + PostgresSaver, in a separate virtual environment.
COMPARE_VENV := .venv-compare
$(COMPARE_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(COMPARE_VENV)
	$(COMPARE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(COMPARE_VENV)/bin/python -m pip install --quiet -e . "langgraph>=1.0,<2" "langgraph-checkpoint-postgres>=3,<4" "psycopg[binary,pool]>=3.2,<4"
	touch $@

bench-compare: $(COMPARE_VENV)/.installed
	$(COMPARE_VENV)/bin/python bench/compare.py

# Workers under fire: M runs with side-effecting tools, K random worker kills; one JSON line.
chaos: migrate
	$(PY) scripts/chaos.py --runs $${M:-200} --kills $${K:-20}

clean:
	rm -rf $(VENV) $(COMPARE_VENV) var $(CONFORMANCE)

# -- demo data: `make run` runs this after migrate ---------------------------------------
.PHONY: seed
seed: migrate
	$(PY) manage.py seed_demo

# -- reliability: the fault-injection tests alone (`make test` runs them too) --------------
.PHONY: reliability
reliability: $(STAMP)
	$(PY) -m pytest -m reliability $(PYTEST_ARGS)
