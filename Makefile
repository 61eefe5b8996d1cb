PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test demo bench clean

$(BIN)/csa-conform: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/csa-conform

test: venv
	$(BIN)/python -m pytest

demo: venv
	mkdir -p build
	$(BIN)/csa-conform generate --suite ci -o build/ci.h5 --force
	$(BIN)/csa-conform verify build/ci.h5
	$(BIN)/csa-conform verify goldens/ci.h5

bench: venv
	$(BIN)/python benchmarks/oracle_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
