# trisque: `make run` starts a node with its data in ./data (HTTP API on 7780, docs/http.md), `make cluster` three joined nodes
# (7711-7713, data in ./data/cluster/<port>), `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run cluster test lint bench fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

run: $(STAMP)
	mkdir -p data
	$(VENV)/bin/trisque-server conf/trisque.conf --dir ./data --http-port 7780

# Three nodes in the foreground, joined with CLUSTER MEET; Ctrl-C stops them (tools/local_cluster.py).
cluster: $(STAMP)
	$(PY) -m tools.local_cluster

test: $(STAMP)
	$(PY) -m pytest -q

# The property tests of tests/property/ with 1,000,000 examples each (hours); Hypothesis
# prints any failing example with the decorator that replays it. FUZZ_ARGS narrows it, e.g.
# make fuzz FUZZ_ARGS="-k resp".
fuzz: $(STAMP)
	TRISQUE_HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider --timeout 0 \
		-o addopts="" tests/property $(FUZZ_ARGS) --hypothesis-show-statistics

lint: $(STAMP)
	$(VENV)/bin/ruff check protocol broker cluster node cli pipeline tests tools
	$(VENV)/bin/mypy

# The single-node table (cli/bench_table.py): trisque against the reference Disque when
# TRISQUE_BENCH_DISQUE=/path/to/disque-server is set (issue 12's targets, PASS/MISS) and against
# redis-server always; then the cluster cases (cli/bench_cluster.py, Disque too when set).
# BENCH_ARGS=--quick: one short run per case, for iteration; other options: --help of each.
bench: $(STAMP)
	$(PY) -m cli.bench_table $(BENCH_ARGS)
	$(PY) -m cli.bench_cluster $(filter --quick,$(BENCH_ARGS))

clean:
	rm -rf $(VENV) build *.egg-info
