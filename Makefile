# trisque: `make run` starts a node with its data in ./data, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

run: $(STAMP)
	mkdir -p data
	$(VENV)/bin/trisque-server conf/trisque.conf --dir ./data

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check protocol broker cluster cli pipeline tests
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m cli.bench_table

clean:
	rm -rf $(VENV) build *.egg-info
