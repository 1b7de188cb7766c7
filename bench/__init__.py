"""The benchmark programs (docs/benchmarks.md), each run as ``python -m bench.<name>`` from the
checkout; ``make bench`` runs ``bench.table`` and ``bench.cluster``. Not installed: the wheel's
load generator is ``trisque-benchmark`` (cli/bench.py)."""
