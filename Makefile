# `make run` serves, `make test` runs the whole suite. Both create .venv and
# install the project into it first, so a machine needs only python3 and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: run test lint clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/t3d serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check t3d spawner bench replay_fixtures tests
	$(BIN)/mypy

# A short benchmark run (STRESS, 20 sessions, 60 s window); the full runs are in docs/benchmarks.md.
BENCH_ARGS ?= --profile stress --sessions 20 --window 60 --warmup 15 --out bench-out/make-bench
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
