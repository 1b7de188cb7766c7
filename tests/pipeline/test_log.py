"""The append log as data: trisque-log and the report, on a log a scripted workload wrote."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import pytest

from client.blocking import Client
from tests.support.server import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _scripted_log() -> tuple[ServerProcess, str]:
    server = ServerProcess(appendonly="yes", appendfsync="always",
                           aof_rewrite_on_shutdown="no").start()
    with Client([f"127.0.0.1:{server.port}"]) as c:
        for i in range(10):
            c.add_job("q1", f"a{i}".encode(), retry=300)
        for i in range(5):
            c.add_job("q2", f"b{i}".encode())
        time.sleep(0.4)  # every q1 job waits at least this long before its first delivery
        got = c.get_job("q1", count=4)
        c.ack_job(*[j.id for j in got[:3]])
        c.nack(got[3].id)
    server.stop()
    return server, server.dir


def _percentile(values: list[float], q: float) -> float:
    """Spark's percentile(): exact, linear interpolation between the closest ranks."""
    values = sorted(values)
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _waits_from_the_log(directory: str) -> dict[str, list[float]]:
    """The wait of every delivered job, read with the broker's own reader and computed here
    without Spark: ctime of the job's record, first delivery from its dlv record (or dtime)."""
    from broker.aof import ReadEnd, read_records
    from broker.job import validate_record

    ctime: dict[bytes, tuple[str, int]] = {}
    first: dict[bytes, int] = {}
    kinds: list[str] = []
    (path,) = glob.glob(os.path.join(directory, "*.aof"))
    with open(path, "rb") as f:
        for kind, data in read_records(f, path, ReadEnd(), validate_record):
            kinds.append(kind)
            if kind == "job":
                ctime[data[0]] = (data[1].decode(), data[8])
                if data[15]:
                    first[data[0]] = min(first.get(data[0], data[15]), data[15])
            elif kind == "dlv":
                first[data[0]] = min(first.get(data[0], data[1]), data[1])
    # GETJOB writes one compact dlv per first delivery and no job record: 15 ADDJOBs, 1 NACK.
    assert kinds.count("dlv") == 4 and kinds.count("job") == 16
    waits: dict[str, list[float]] = {}
    for job_id, when in first.items():
        queue, created = ctime[job_id]
        waits.setdefault(queue, []).append((when * 1_000_000 - created) / 1e6)
    return waits


def test_report_counts_a_scripted_workload(spark) -> None:
    from pipeline.report import build_report

    server, directory = _scripted_log()
    try:
        per_queue, _ = build_report(spark, directory)
        rows = {r.queue: r for r in per_queue.collect()}
        assert (rows["q1"].jobs_in, rows["q1"].jobs_acked, rows["q1"].nacks) == (10, 3, 1)
        assert (rows["q2"].jobs_in, rows["q2"].jobs_acked, rows["q2"].nacks) == (5, 0, 0)
        # Four q1 jobs were delivered (one NACKed and requeued: its first delivery counts),
        # none of q2's.
        assert (rows["q1"].jobs_delivered, rows["q2"].jobs_delivered) == (4, 0)
        assert 400 <= rows["q1"].wait_p50_ms <= rows["q1"].wait_p99_ms < 5000
        assert rows["q2"].wait_p50_ms is None and rows["q2"].wait_p99_ms is None
        waits = _waits_from_the_log(directory)
        assert set(waits) == {"q1"} and len(waits["q1"]) == 4
        assert rows["q1"].wait_p50_ms == pytest.approx(_percentile(waits["q1"], 0.5), abs=1e-3)
        assert rows["q1"].wait_p99_ms == pytest.approx(_percentile(waits["q1"], 0.99), abs=1e-3)
    finally:
        server.__exit__()


@pytest.mark.slow
def test_report_command_prints_the_wait_per_queue() -> None:
    # As a user runs it: its own process and SparkSession (main() stops the session it made).
    server, directory = _scripted_log()
    try:
        env = {**os.environ, "PYTHONPATH": REPO, "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run([sys.executable, "-m", "pipeline.report", "report", "--log",
                               directory], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        out = done.stdout
        q1 = next(line for line in out.splitlines() if line.startswith("q1 "))
        q2 = next(line for line in out.splitlines() if line.startswith("q2 "))
        *_, delivered, p50, p99 = q1.split()
        assert int(delivered) == 4 and 400 <= float(p50) <= float(p99)
        assert q2.split()[-3:] == ["0", "n/a", "n/a"]
        assert "wait p50 ms" in out and "wait p99 ms" in out
    finally:
        server.__exit__()


def test_corrupt_log_fails_with_file_and_offset(spark) -> None:
    server, directory = _scripted_log()
    try:
        (path,) = glob.glob(os.path.join(directory, "*.aof"))
        size = os.path.getsize(path)
        with open(path, "r+b") as f:  # flip a byte in the middle: bad frame followed by data
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        df = spark.read.format("trisque-log").option("path", path).load()
        with pytest.raises(Exception, match=rf"{path}.*offset \d+"):
            df.collect()
    finally:
        server.__exit__()
