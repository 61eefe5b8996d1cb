# Set-up on a fresh machine is two commands: `make demo` (the main job on the
# committed ci suite) and `make test` (the whole suite CI runs). Both build .venv
# first; afterwards `. .venv/bin/activate` puts csa-conform on PATH. `make check`
# is the fast tier, `make browser` the Chromium the HTML screenshot test needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CSA := $(BIN)/csa-conform

.PHONY: venv browser test check demo bench bench-io clean

$(CSA): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(CSA)

# The HTML report's screenshot test needs a headless Chromium, which `make test` never installs (it
# changes nothing outside the checkout): `make browser` does, from Debian's packages as root; without
# it that test skips and says why. .ci/run calls both.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; }; } || \
		echo "make browser: no chromium (needs root and apt-get to install it); the HTML screenshot test will skip"

# One worker per core (pytest-xdist).
test: venv
	$(BIN)/python -m pytest -n auto

# The fast tier for the edit-test loop: the contract, the numerics, the spec tables, the golden file's
# layout and the layering; no subprocess, no kernel build.
check: venv
	$(BIN)/python -m pytest -n auto -q tests/contract tests/numerics tests/spec tests/test_layers.py \
		tests/test_specs.py tests/goldens/test_golden_file_spec.py tests/goldens/test_golden_store.py

demo: venv
	mkdir -p build
	$(CSA) verify goldens/ci.h5 --json > build/verify.json
	$(CSA) generate --suite ci -o build/ci.h5 --force
	$(CSA) verify build/ci.h5
	$(CSA) diff --force-host all --json > build/diff.json
	$(CSA) report build/verify.json build/diff.json --junit build/junit.xml --json build/summary.json

# Benchmarks run by hand, never in CI: the oracle's engines, then generate/verify of prod before
# (BENCH_BEFORE, main before the generate/verify work benchmarks/README.md measures) vs this checkout.
BENCH_BEFORE ?= 952a4ed

bench: venv bench-io
	$(BIN)/python benchmarks/oracle_bench.py

bench-io: venv
	$(BIN)/python benchmarks/generate_verify_bench.py --before $(BENCH_BEFORE)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
