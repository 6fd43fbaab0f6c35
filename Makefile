# Two entry points: `make demo` (generate, prepare, load a small multimodal dataset) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo demo-av test lint bench clean

$(BIN)/energon: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first, so nothing pulls CUDA wheels.
	$(BIN)/pip install -q --no-cache-dir torch==2.13.0
	$(BIN)/pip install -q --no-cache-dir -e '.[test]'
	touch $(BIN)/energon

install: $(BIN)/energon

demo: install
	$(BIN)/energon demo --workdir demo_data

demo-av: install
	$(BIN)/energon demo-av --workdir demo_av_data

test: install
	$(BIN)/ruff check energon tests tools
	$(BIN)/ruff format --check energon tests tools
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=15 tests

# Re-run every benchmark and rewrite docs/benchmarks.md (about 25 minutes on a quiet 2-core machine).
bench: install
	$(BIN)/python tools/benchmarks/run_all.py --root bench_data

lint: install
	$(BIN)/ruff format energon tests tools
	$(BIN)/ruff check --fix energon tests tools

clean:
	rm -rf $(VENV) demo_data demo_av_data bench_data
