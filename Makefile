# Two entry points: `make demo` and `make test` (`make check`: the inner loop, without the slow tests). Each sets up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test check lint

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/shadow demo

lint: $(BIN)/.installed
	$(BIN)/python tools/check_sizes.py
	$(BIN)/python tools/settings_doc.py --check
	$(BIN)/ruff check shadow tests benchmarks tools
	$(BIN)/mypy shadow

# servers some tests start on loopback: where one is absent its tests skip; say how to get them
HINT = for b in chromium redis-server nginx prometheus; do command -v $$b >/dev/null 2>&1 || [ -x /usr/sbin/$$b ] || \
	echo "make: no $$b here, its tests will skip (Debian: sudo apt-get install $$b; .ci/run installs it)"; done

test: lint
	@$(HINT)
	$(BIN)/pytest -q -n auto

# the inner loop: lint and every test but those marked slow (under 4 minutes on 2 cores)
check: lint
	$(BIN)/pytest -q -n auto -m "not slow"
