# trisque: `make run` starts a node with its data in ./data (HTTP API on 7780, docs/http.md), `make cluster` three joined nodes
# (7711-7713, data in ./data/cluster/<port>), `make test` runs the in-process tests on the compiled core and on the pure-Python
# one, and the tests that start processes once, on the compiled core.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# make test CORE=compiled|pure runs the suite on one core only; REQUIRE_COMPILED=1 (CI) makes a
# core that cannot be compiled an error instead of a warning. JOBS: the pytest-xdist workers of
# the run with the tests that start processes (they mostly wait on their nodes: more workers
# than cores pay); JOBS=0 runs it in one process. SLOW=0 leaves out the tests marked slow
# (ten seconds or more each: crash cycles, fuzzers, Spark applications of their own).
CORE ?= both
REQUIRE_COMPILED ?= 0
JOBS ?= 4
SLOW ?= 1

.PHONY: build run cluster test lint bench fuzz clean

# The editable install leaves compiling to `make build`, where its progress shows. It is a path
# entry (compat mode), not setuptools' import finder, which costs every Python process (each
# `trisque` run, each test's server) about 10 ms of start-up. setuptools calls compat mode
# transitional: where it is gone, the default editable install is used.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	TRISQUE_COMPILE=0 $(PY) -m pip install --quiet -e '.[dev,spark]' \
		--config-settings editable_mode=compat \
		|| TRISQUE_COMPILE=0 $(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# Compile protocol/, broker/ and cluster/ with mypyc in place (tools/build_core.py): a minute or
# two the first time, instant while no source changed. Without a C compiler: a warning, and the
# pure-Python core runs. An edited module is never shadowed by its old compiled version: the
# core loads compiled only while every source matches the build (protocol/core_build.py).
build: $(STAMP)
	$(PY) -m tools.build_core $(if $(filter 1,$(REQUIRE_COMPILED)),--require)

run: build
	mkdir -p data
	$(VENV)/bin/trisque-server conf/trisque.conf --dir ./data --http-port 7780

# Three nodes in the foreground, joined with CLUSTER MEET; Ctrl-C stops them (tools/local_cluster.py).
cluster: build
	$(PY) -m tools.local_cluster $(CLUSTER_ARGS)

# The whole suite on the compiled core (TRISQUE_CORE=compiled: a run on anything else fails),
# then the in-process tests on the pure-Python core: the tests that start real processes
# (marker process, set by tests/conftest.py) and the Spark ones test the node, the workers and
# the connector as processes, which the compiled run has done. With no compiled core here, the
# whole suite on the pure one. The suite runs in JOBS pytest-xdist workers (tests/conftest.py
# makes the work units and sends the long ones out first; tests/support/server.py gives each
# worker its own ports), then the tests marked timing alone; the in-process tests in one
# worker per CPU.
XDIST = --dist loadfile --no-loadscope-reorder
AND_NOT_SLOW = $(if $(filter 0,$(SLOW)), and not slow)
SUITE = $(PY) -m pytest -q -n $(JOBS) $(XDIST) -m "not timing$(AND_NOT_SLOW)"; \
	echo "== make test: the timing tests, alone"; $(PY) -m pytest -q -m "timing$(AND_NOT_SLOW)"
test: build
	@set -e; compiled=0; \
	if [ "$(CORE)" = compiled ] || { [ "$(CORE)" != pure ] && $(PY) -m tools.build_core --check; }; then \
		echo "== make test: the whole suite on the compiled core"; \
		export TRISQUE_CORE=compiled; $(SUITE); compiled=1; \
	elif [ "$(CORE)" != pure ]; then \
		echo "== make test: no compiled core here (see make build above): the pure core only"; \
	fi; \
	export TRISQUE_CORE=pure; \
	if [ "$(CORE)" != compiled ]; then \
		if [ $$compiled = 1 ]; then \
			echo "== make test: the in-process tests on the pure-Python core (TRISQUE_CORE=pure)"; \
			$(PY) -m pytest -q -n auto $(XDIST) -m "not spark and not process$(AND_NOT_SLOW)"; \
		else \
			echo "== make test: the whole suite on the pure-Python core (TRISQUE_CORE=pure)"; \
			$(SUITE); fi; \
	fi

# The property tests of tests/property/ with 1,000,000 examples each (hours); Hypothesis
# prints any failing example with the decorator that replays it. FUZZ_ARGS narrows it, e.g.
# make fuzz FUZZ_ARGS="-k resp". Then 1,000,000 fuzzed frames on a real cluster's bus, plain
# and with tls-cluster yes (tools/fuzz_bus.py [--tls]; BUS_FUZZ_ARGS="--count N --seed S"
# changes them), 1,000,000 RESP inputs over TLS (tools/fuzz_resp.py --tls) and 300,000 HTTP
# requests, plain and over HTTPS (tools/fuzz_http.py), each from a random seed it prints.
fuzz: $(STAMP)
	TRISQUE_HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider --timeout 0 \
		-o addopts="" tests/property $(FUZZ_ARGS) --hypothesis-show-statistics
	$(PY) -m tools.fuzz_bus --count 1000000 $(BUS_FUZZ_ARGS)
	$(PY) -m tools.fuzz_bus --tls --count 1000000 $(BUS_FUZZ_ARGS)
	$(PY) -m tools.fuzz_resp --tls --count 1000000 --seconds 7200
	$(PY) -m tools.fuzz_http --count 300000 --seconds 7200
	$(PY) -m tools.fuzz_http --tls --count 300000 --seconds 7200

lint: $(STAMP)
	$(VENV)/bin/ruff check protocol client broker cluster node cli pipeline bench tests tools setup.py
	$(VENV)/bin/mypy

# The single-node table (bench/table.py): trisque against the reference Disque when
# TRISQUE_BENCH_DISQUE=/path/to/disque-server is set (the targets in docs/benchmarks.md, PASS/MISS) and against
# redis-server always; then the cluster cases (bench/cluster.py, Disque too when set), then
# WAITJOB's round trip on three nodes (bench/waitjob.py).
# BENCH_ARGS=--quick: one short run per case, for iteration; other options: --help of each.
# On the compiled core (make build; python -m bench.builds compares it with the pure one).
bench: build
	$(PY) -m bench.table $(BENCH_ARGS)
	$(PY) -m bench.cluster $(filter --quick,$(BENCH_ARGS))
	$(PY) -m bench.waitjob $(if $(filter --quick,$(BENCH_ARGS)),--count 200 --seconds 15)

clean:
	rm -rf $(VENV) build *.egg-info trisque_core__mypyc.*.so protocol/compiled-core.json
	rm -f protocol/*.so broker/*.so cluster/*.so node/*.so
