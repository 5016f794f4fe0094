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

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check topos dialect
	$(VENV)/bin/mypy topos dialect

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
