"""``make bench``'s table (bench/table.py, bench/report.py): the verdicts, the reading of
redis-benchmark's output, the choice of the reference, and one short real run.

The real run is bounded: one case, one run of 0.3 s per server after a warm-up of a few
thousand requests, a subprocess timeout. It proves what a reader of the table relies on: the
figures come from real servers (the queue really holds the jobs), the ratio is the ratio, and
the verdict is the target's. With ``TRISQUE_BENCH_DISQUE`` set in the environment the run also
measures that Disque binary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import (
    DISQUE_TARGETS,
    Figures,
    Row,
    Sample,
    parse_redis_benchmark_csv,
    render,
)
from bench.servers import DISQUE_ENV, disque_binary
from bench.table import Contender
from cli.bench_load import BenchError
from tests.support.server import REPO, ServerProcess, repo_env

# What redis-benchmark 7.0 --csv printed for one run against a Disque server.
CSV = ('"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",'
       '"p99_latency_ms","max_latency_ms"\n'
       '"ADDJOB q xxxxxxxxxxxxxxxx 0","83472.46","0.475","0.048","0.447","0.743","1.127","12.527"\n')


def figures(*rates: float) -> Figures:
    return Figures([Sample(r) for r in rates])


class TestReport:
    def test_redis_benchmark_csv(self) -> None:
        s = parse_redis_benchmark_csv(CSV)
        assert s is not None
        assert (s.ops_per_sec, s.p50_ms, s.p99_ms) == (83472.46, 0.447, 1.127)
        assert parse_redis_benchmark_csv("") is None
        assert parse_redis_benchmark_csv(CSV.splitlines()[0]) is None  # header, no data
        assert parse_redis_benchmark_csv(CSV.replace("83472.46", "fast")) is None

    def test_ratio_of_medians_and_verdicts(self) -> None:
        row = Row("a", "(a)", figures(10, 30, 20), figures(40, 50, 30), target=DISQUE_TARGETS["a"])
        assert row.ratio() == 0.5  # median 20 / median 40
        assert row.verdict() == "MISS"
        row.ours = figures(24)
        assert row.ratio() == 0.6 and row.verdict() == "PASS"  # >= 0.60 holds at the bound
        memory = Row("d", "(d)", figures(534), figures(500), target=DISQUE_TARGETS["d"])
        assert memory.verdict() == "MISS"  # bytes per job: lower is better, <= 1.00x
        memory.ref = figures(534)
        assert memory.verdict() == "PASS"
        own = Row("d", "(d)", figures(534), figures(20), target=("<=", 600.0), absolute=True)
        assert own.verdict() == "PASS"  # trisque's own bytes, not the ratio (26.7x)

    def test_a_side_without_runs_is_na_with_its_reason(self) -> None:
        row = Row("a", "(a) ADDJOB", figures(100), Figures(failure="exited with 1: bad option"),
                  target=DISQUE_TARGETS["a"])
        assert row.ratio() is None and row.verdict() == "n/a"
        text = render([("against Disque", "Disque", [row]), ("empty", "redis", [])],
                      ["header"], "redis-benchmark", None)
        assert "n/a [1]" in text and "[1] n/a: exited with 1: bad option" in text
        assert "empty" not in text  # a section with no rows is left out

    def test_a_median_of_fewer_runs_says_so(self) -> None:
        partial = Figures([Sample(100.0), Sample(300.0)], failure="did not finish within 60 s")
        row = Row("a", "(a) ADDJOB", partial, figures(400), target=DISQUE_TARGETS["a"])
        text = render([("s", "Disque", [row])], [], "redis-benchmark", None)
        assert "200 [1]" in text
        assert "[1] after 2 run(s): did not finish within 60 s" in text

    def test_secondary_generator_line(self) -> None:
        row = Row("b", "(b)", figures(10), figures(40), figures(20), figures(40),
                  target=DISQUE_TARGETS["b"])
        text = render([("s", "Disque", [row])], [], "redis-benchmark", "trisque-benchmark")
        line = next(x for x in text.splitlines() if "trisque-benchmark driving both" in x)
        assert "0.500x" in line and "PASS" not in line and "MISS" not in line
        assert "0.250x" in text and "MISS" in text


class TestDisqueBinary:
    def test_unset_means_no_disque(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv(DISQUE_ENV, raising=False)
        assert disque_binary() is None

    def test_the_variable_or_the_option(self, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
        exe = tmp_path / "disque-server"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        monkeypatch.setenv(DISQUE_ENV, str(exe))
        assert disque_binary() == str(exe)
        assert disque_binary(sys.executable) == sys.executable  # --disque wins

    def test_a_wrong_path_is_an_error_naming_where_it_came_from(
            self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.setenv(DISQUE_ENV, str(tmp_path / "missing"))
        with pytest.raises(ValueError, match=DISQUE_ENV):
            disque_binary()
        proc = subprocess.run([sys.executable, "-m", "bench.table", "--quick"], cwd=REPO,
                              env={**repo_env(), DISQUE_ENV: str(tmp_path)}, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2
        assert f"{DISQUE_ENV}='{tmp_path}' is not an executable file" in proc.stderr


needs_redis_benchmark = pytest.mark.skipif(
    not shutil.which("redis-benchmark") or not shutil.which("redis-server"),
    reason="redis-benchmark and redis-server are the table's generator and yardstick")


class _Unflushed:
    """A node as the table's contender sees it, minus the flush between runs (which would
    lift the pause the test sets)."""

    kind, label, failure, ok = "trisque", "trisque", None, True

    def __init__(self, port: int) -> None:
        self.port = port

    def flush(self) -> None:
        pass


@needs_redis_benchmark
def test_error_replies_do_not_count_as_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ADDJOB answered -PAUSED: the run fails, it does not count 2,000 requests."""
    with ServerProcess(appendonly="no") as node:
        assert node.call("PAUSE", "rbq", "in") == b"in"
        contender = Contender(_Unflushed(node.port))  # type: ignore[arg-type]
        # redis-benchmark 7 stops at an error reply itself ...
        with pytest.raises(BenchError, match="Error from server: PAUSED"):
            contender.c_run(2000, timeout=60)
        # ... older ones count it; then the queue's length is what tells.
        monkeypatch.setattr("bench.table.redis_benchmark", lambda *a, **k: Sample(1e6))
        with pytest.raises(BenchError, match="0 jobs in the queue after 2000 requests, "
                                             "expected 2000: not every reply was a job"):
            contender.c_run(2000, timeout=60)


@needs_redis_benchmark
def test_one_short_real_run(tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    argv = [sys.executable, "-m", "bench.table", "--only", "a", "--runs", "1",
            "--duration", "0.3", "--alt-runs", "0", "--out", str(out)]
    proc = subprocess.run(argv, cwd=REPO, env=repo_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "primary load generator: redis-benchmark" in proc.stdout
    result = json.loads(out.read_text())
    assert result["primary_generator"] == "redis-benchmark"
    sections = ["vs_redis"] + (["vs_disque"] if os.environ.get(DISQUE_ENV) else [])
    for section in sections:
        (row,) = result[section]
        assert row["key"] == "a"
        ours, ref = row["trisque"]["median"], row["reference"]["median"]
        assert ours > 0 and ref > 0, row
        assert row["ratio"] == pytest.approx(ours / ref)
        op, bound = row["target"]
        assert row["verdict"] == ("PASS" if row["ratio"] >= bound else "MISS")
        assert row["trisque"]["runs"][0]["load"] is not None
        line = next(x for x in proc.stdout.splitlines() if x.startswith("(a) ADDJOB"))
        assert f"{row['ratio']:.3f}x" in proc.stdout and line
    if not os.environ.get(DISQUE_ENV):
        assert f"set {DISQUE_ENV}=" in proc.stdout
