# Two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint install clean

$(VENV)/installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/installed

demo: install
	$(PY) examples/walkthrough.py

# One worker process per core, each test file on one worker (module fixtures and
# compile caches stay shared within a file); plain pytest runs serially.
test: install
	$(PY) -m pytest -q -n auto --dist loadfile

lint: install
	$(VENV)/bin/ruff check topos dialect benchmarks examples tests
	$(VENV)/bin/mypy topos dialect

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
