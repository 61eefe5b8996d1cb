PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test golden-check bench clean

$(BIN)/csa-conform: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/csa-conform

test: venv
	$(BIN)/python -m pytest

golden-check: venv
	$(BIN)/csa-conform generate --suite ci -o /tmp/csa-ci.h5 --force
	$(BIN)/csa-conform verify /tmp/csa-ci.h5

bench: venv
	$(BIN)/python benchmarks/oracle_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
