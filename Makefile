# Everything a fresh machine needs: `make demo` trains the demo model, `make test` runs the tests.
# Both create a local virtual environment in .venv first (Python 3.11+ as $(PYTHON)).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: install
	$(BIN)/python launch.py train --config=experiments/demo.py --workdir=workdirs/demo

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) workdirs .jax_cache
