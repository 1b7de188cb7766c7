"""``make bench``'s cluster rows (bench/cluster.py, bench/cluster_report.py): the verdicts
against the resolve bar and the goal, the p99 of jobs left undelivered, the interleaving, the
consumer of (h) against a real node, and one short real run without Disque (its cells n/a).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cluster import Cluster, consume_all, info_field, interleaved
from bench.cluster_report import (
    FEDERATION_P99,
    ONE_CONNECTION_P50,
    RATE,
    Row,
    Side,
    p99_lower_bound,
    render,
)
from cli.bench_load import BenchError
from tests.support.server import REPO, ServerProcess, repo_env


def rate_row(ours: list[float], ref: list[float]) -> Row:
    return Row("rate", "/s", Side(ours), Side(ref), RATE)


class TestVerdicts:
    def test_a_rate_passes_the_bar_at_0_8_and_the_goal_at_1_0(self) -> None:
        assert (rate_row([8_000.0], [10_000.0]).verdict(), rate_row([8_000.0], [10_000.0])
                .verdict(goal=True)) == ("PASS", "MISS")
        assert rate_row([7_900.0], [10_000.0]).verdict() == "MISS"
        assert rate_row([10_000.0], [10_000.0]).verdict(goal=True) == "PASS"

    def test_the_ratio_is_of_the_medians(self) -> None:
        row = rate_row([1.0, 9.0, 5.0], [10.0, 2.0, 6.0])
        assert row.ratio() == pytest.approx(5.0 / 6.0)

    def test_a_latency_is_judged_lower_is_better(self) -> None:
        p50 = Row("p50", "ms", Side([0.16]), Side([0.135]), ONE_CONNECTION_P50)
        assert (p50.verdict(), p50.verdict(goal=True)) == ("PASS", "MISS")  # 1.19x
        assert Row("p50", "ms", Side([0.17]), Side([0.135]), ONE_CONNECTION_P50
                   ).verdict() == "MISS"
        p99 = Row("p99", "ms", Side([270.0]), Side([270.0]), FEDERATION_P99)
        assert (p99.verdict(), p99.verdict(goal=True)) == ("PASS", "PASS")
        p99.trisque.values[0] = 271.0
        assert p99.verdict() == "MISS"

    def test_without_disque_the_verdict_is_na_not_an_error(self) -> None:
        row = Row("rate", "/s", Side([2_000.0]), Side(failure="no reference Disque"), RATE)
        assert (row.ratio(), row.verdict(), row.verdict(goal=True)) == (None, "n/a", "n/a")
        text = render([row])
        assert "2,000/s" in text and "n/a [1]" in text and "[1] no reference Disque" in text

    def test_an_unjudged_row_has_no_verdict(self) -> None:
        row = Row("idle", "", Side([20.0]), Side([30.0]))
        assert row.verdict() == "" and row.ratio() == pytest.approx(2 / 3)

    def test_the_table_has_both_verdicts_cpu_and_load(self) -> None:
        row = rate_row([8_500.0], [10_000.0])
        row.trisque.cpu_us, row.disque.cpu_us = [97.0], [34.0]
        row.trisque.loads, row.disque.loads = [1.5], [2.25]
        (line,) = [x for x in render([row]).splitlines() if x.startswith("rate")]
        assert line.split() == ["rate", "8,500/s", "10,000/s", "0.85x", ">=", "0.8x", "PASS",
                                ">=", "1.0x", "MISS", "97", "|", "34", "1.5-2.2"]


def test_undelivered_jobs_raise_the_p99_to_their_wait() -> None:
    assert p99_lower_bound(150.0, 10_000, 50, 5_000.0) == 150.0  # 0.5 %: p99 unaffected
    assert p99_lower_bound(150.0, 10_000, 500, 5_000.0) == 5_000.0
    assert p99_lower_bound(9_000.0, 10_000, 500, 5_000.0) == 9_000.0


def test_info_fields() -> None:
    text = b"# Federation\r\nneedjobs_sent:20\r\nyourjobs_sent:3\r\n"
    assert info_field(text, "needjobs_sent") == 20
    assert info_field(text, "cluster_stats_messages_sent") == 0  # Disque: no such field


class _Fake(Cluster):
    def __init__(self, kind: str, calls: list[str]) -> None:
        super().__init__(kind, [])
        self.calls = calls

    def flush(self) -> None:
        self.calls.append(f"flush {self.kind}")


def test_runs_alternate_and_a_failed_side_skips_its_other_runs() -> None:
    calls: list[str] = []
    clusters: list[Cluster] = [_Fake("trisque", calls), _Fake("disque", calls)]
    runs = {"trisque": 0, "disque": 0}

    def measure(c: Cluster) -> dict[str, tuple[float, float | None]]:
        calls.append(f"run {c.kind}")
        runs[c.kind] += 1
        if c.kind == "disque" and runs["disque"] == 2:
            raise BenchError("refused")
        return {"rate": (100.0 * runs[c.kind], 5.0), "p50": (0.1, None)}

    sides = interleaved("(x)", clusters, 3, ["rate", "p50"], measure)
    assert [x for x in calls if x.startswith("run")] == [
        "run trisque", "run disque", "run disque", "run trisque", "run trisque"]
    assert calls[:2] == ["flush trisque", "run trisque"]  # flushed before every run
    assert sides["rate"]["trisque"].values == [100.0, 200.0, 300.0]
    assert sides["rate"]["trisque"].cpu_us == [5.0, 5.0, 5.0]
    assert sides["p50"]["trisque"].cpu_us == []
    assert len(sides["rate"]["trisque"].loads) == 3
    assert sides["rate"]["disque"].values == [100.0]
    assert sides["p50"]["disque"].failure == "(x), disque run 2: refused"


def test_the_consumer_takes_and_acknowledges_every_job() -> None:
    with ServerProcess(appendonly="no") as node:
        for i in range(250):
            assert node.call("ADDJOB", "cq", f"job-{i}", "0").startswith(b"D-")
        seconds = consume_all(node.port, "cq", 250, deadline_s=30)
        assert 0 < seconds < 30
        assert node.call("QLEN", "cq") == 0
        assert node.call("INFO", "jobs").count(b"registered_jobs:0") == 1  # FASTACKed
        with pytest.raises(BenchError, match="took 0 of 1 jobs"):
            consume_all(node.port, "empty", 1, deadline_s=0.5)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="needs redis-benchmark")
def test_one_short_real_run_without_disque(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    # 5,000 jobs: the servers' CPU is read in clock ticks (10 ms), and 300 pipelined jobs
    # took less than one tick on the three nodes.
    argv = [sys.executable, "-m", "bench.cluster", "--runs", "1", "--duration", "0.3",
            "--jobs", "5000", "--idle", "1", "--procs", "1", "--out", str(out)]
    env = {k: v for k, v in repo_env().items() if k != "TRISQUE_BENCH_DISQUE"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["title"].strip(): r for r in json.loads(out.read_text())["rows"]}
    for title in ("(g) ADDJOB REPLICATE 3, 1 conn", "(g) ADDJOB REPLICATE 3 ASYNC, 50 conns",
                  "(h) 5,000 ADDJOB REPL 3 pipelined 100, node 1",
                  "(i) federation: produce node 1, consume node 2"):
        row = rows[title]
        assert row["trisque_median"] > 0 and row["trisque"]["cpu_us"][0] > 0, row
        assert (row["disque_median"], row["bar"], row["goal"]) == (None, "n/a", "n/a")
    assert rows["p50 latency, 1 conn"]["trisque_median"] > 0
    assert rows["(j) idle 1 s: bus messages, 3 nodes"]["trisque_median"] > 0
    assert "no reference Disque in this run" in proc.stdout
    # (u): the TLS cluster against the plaintext one, both measured and judged.
    (tls,) = json.loads(out.read_text())["tls_rows"]
    assert tls["trisque_median"] > 0 and tls["disque_median"] > 0, tls
    assert tls["bar"] in ("PASS", "MISS") and tls["trisque"]["cpu_us"][0] > 0, tls
    assert "tls-cluster" in proc.stdout
