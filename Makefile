# Two commands on a fresh machine:  make demo  (side-by-side comparison)  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench docs clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lowband compare --suite demo

# the suite on both cores (pytest-xdist; a file's tests stay on one worker): ~10.5 min on the 2-core machine
test: $(STAMP) lint
	$(BIN)/python -m pytest tests -n 2 --dist loadfile --durations=15

# ruff (lint + import order) and mypy (types, src/), both configured in pyproject.toml, gate `make test`
lint: $(STAMP)
	$(BIN)/python -m ruff check src tests benchmarks examples
	$(BIN)/python -m mypy

# the inner loop: the unit layer without its slow tests (about 30 s)
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -m "not slow"

# the user guide (docs/, mkdocs.yml) into build/site; --strict: a broken link or a page left out fails
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache
