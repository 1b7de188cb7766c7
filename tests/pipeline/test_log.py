"""The append log as data: trisque-log and the report, on a log a scripted workload wrote."""

from __future__ import annotations

import glob
import os

import pytest

from protocol.client import Client
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _scripted_log() -> tuple[ServerProcess, str]:
    server = ServerProcess(appendonly="yes", appendfsync="always",
                           aof_rewrite_on_shutdown="no").start()
    with Client([f"127.0.0.1:{server.port}"]) as c:
        for i in range(10):
            c.add_job("q1", f"a{i}".encode(), retry=300)
        for i in range(5):
            c.add_job("q2", f"b{i}".encode())
        got = c.get_job("q1", count=4)
        c.ack_job(*[j.id for j in got[:3]])
        c.nack(got[3].id)
    server.stop()
    return server, server.dir


def test_report_counts_a_scripted_workload(spark) -> None:
    from pipeline.report import build_report

    server, directory = _scripted_log()
    try:
        per_queue, _ = build_report(spark, directory)
        rows = {r.queue: r for r in per_queue.collect()}
        assert (rows["q1"].jobs_in, rows["q1"].jobs_acked, rows["q1"].nacks) == (10, 3, 1)
        assert (rows["q2"].jobs_in, rows["q2"].jobs_acked, rows["q2"].nacks) == (5, 0, 0)
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
