# Two entry points: `make demo` and `make test`. Each sets up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/shadow demo

lint: $(BIN)/.installed
	$(BIN)/python tools/check_sizes.py
	$(BIN)/ruff check shadow tests benchmarks tools
	$(BIN)/mypy shadow

test: lint
	$(BIN)/pytest -q -n auto
