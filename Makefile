# Everything a fresh machine needs: `make demo` trains the demo model, `make test` runs the tests.
# Both create a local virtual environment in .venv first (Python 3.11+ as $(PYTHON), 3.12 if found); the demo
# installs elmo_jax with matplotlib (its curves), the tests add the dev extra (pytest, pytest-xdist,
# ruff, mypy, TFDS).
# Python 3.12 where the machine has one (on PATH or from pyenv): `elmo-jax plan`'s compiler plugin
# and its test need it; else python3.
PY312 := $(shell (python3.12 -c '' && command -v python3.12 || ls -d $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12) 2>/dev/null | tail -1)
PYTHON ?= $(or $(PY312),python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-targets test-fast test-py311 test-floors fixtures fixtures-check lint gpu-cpu install clean

install: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[plot]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/elmo-jax train --config=demo --workdir=workdirs/demo

# 2 workers: a compile keeps one core busy and leaves the other idle. The compiles of the published
# model's default step for every accelerator target (marked targets: 15, a minute each) are
# test-targets', which CI runs after this.
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -rs -n 2 --dist worksteal -m "not targets"

test-targets: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -rs -n 2 --dist worksteal -m targets

# The edit-test loop: no test that starts a process (tests/conftest.py), none marked slow.
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -rs -n 2 --dist worksteal -m "not launches and not slow"

# The suite in the other environments pyproject.toml declares (.ci/lane, .ci/run runs both): Python 3.11
# with what it resolves today, and Python 3.11 with every dependency at its floor (.ci/floors.txt).
test-py311:
	bash .ci/lane py311

test-floors:
	bash .ci/lane floors

# tests/fixtures made again from the original code: bilm-tf and AllenNLP, each in an environment of its
# own (docs/CONTRIBUTING.md, "Fixtures"); fixtures-check makes them elsewhere and compares, byte for byte.
fixtures: $(VENV)/.installed-dev
	$(BIN)/python -m tests.reference.make

fixtures-check: $(VENV)/.installed-dev
	$(BIN)/python -m tests.reference.make --check

# ruff (format and lint) and mypy (types, pyproject.toml's [tool.mypy]); .pre-commit-config.yaml runs the same.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# benchmarks/gpu.sh in CPU mode: every step of the accelerator run at toy sizes, so that it runs the
# first time a device is lent (CI runs it; its numbers mean nothing). Output in .gpu_cpu/.
gpu-cpu: $(VENV)/.installed-dev
	rm -rf .gpu_cpu && mkdir -p .gpu_cpu
	GPU_SH_CPU=1 OUT=.gpu_cpu PYTHON=$(BIN)/python bash benchmarks/gpu.sh > .gpu_cpu/gpu.log 2>&1; \
	  if [ -e .gpu_cpu/failures.txt ]; then cat .gpu_cpu/failures.txt; tail -40 .gpu_cpu/gpu.log; exit 1; fi

clean:
	rm -rf $(VENV) .venv-py311 .venv-floors workdirs .jax_cache .gpu_cpu
