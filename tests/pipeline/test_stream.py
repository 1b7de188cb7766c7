"""The streaming read: AvailableNow into Parquet, ack-on-commit, replay after a failure, and
the WORKING keep-alive, against one real node."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from client.blocking import Client
from protocol.resp import NEED_DATA, ReplyReader

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _load(nodes_opt: str, queue: str, n: int, retry: int | None = None) -> list[str]:
    with Client([nodes_opt]) as c:
        p = c.pipeline()
        for i in range(n):
            p.add_job(queue, f"{queue}-{i}".encode(), retry=retry)
        return list(p.execute())


def _stream(spark, nodes_opt: str, queue: str, per_batch: int, **extra: str):
    reader = (spark.readStream.format("trisque").option("nodes", nodes_opt)
              .option("queue", queue).option("maxJobsPerBatch", str(per_batch)))
    for k, v in extra.items():
        reader = reader.option(k, v)
    return reader.load()


def _all_acked(nodes_opt: str, queue: str) -> tuple[int, list[str]]:
    with Client([nodes_opt]) as c:
        return c.qlen(queue), list(c.jscan(queue=queue))


def test_available_now_three_batches_into_parquet_then_all_acked(spark, nodes_opt, tmp_path) -> None:
    ids = _load(nodes_opt, "s3", 300)
    query = (_stream(spark, nodes_opt, "s3", 100).writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [100, 100, 100]
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.id for r in rows) == sorted(ids)
    assert {bytes(r.body) for r in rows} == {f"s3-{i}".encode() for i in range(300)}
    # The last batch is never committed by Spark in an AvailableNow run: the broker still
    # holds it until the next run's latestOffset acks it.
    query2 = (_stream(spark, nodes_opt, "s3", 100).writeStream.format("parquet")
              .option("path", str(tmp_path / "out"))
              .option("checkpointLocation", str(tmp_path / "cp"))
              .trigger(availableNow=True).start())
    query2.awaitTermination(240)
    assert query2.exception() is None
    assert _all_acked(nodes_opt, "s3") == (0, [])
    assert spark.read.parquet(str(tmp_path / "out")).count() == 300


class _Monitor:
    """Every command the node runs, read from a MONITOR connection in a thread: the test
    counts the ACKJOBs of each job ID with it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._reader = ReplyReader()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not data:
                return
            self._reader.feed(data)
            while (reply := self._reader.next()) is not NEED_DATA:
                self.lines.append(reply.decode() if isinstance(reply, bytes) else str(reply))

    def acked(self) -> Counter[str]:
        """Job ID -> how many ACKJOB commands named it."""
        counts: Counter[str] = Counter()
        for line in self.lines:
            args = re.findall(r'"((?:[^"\\]|\\.)*)"', line)
            if args and args[0].upper() == "ACKJOB":
                counts.update(args[1:])
        return counts

    def close(self) -> None:
        time.sleep(0.5)  # let the last commands arrive
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.mark.slow
def test_sink_failure_then_restart_in_a_new_spark_session_replays_same_rows_acks_nothing_twice(
        spark, node, nodes_opt, tmp_path) -> None:
    ids = _load(nodes_opt, "rp", 200, retry=300)
    monitor = _Monitor(node.port)
    seen: list[list[str]] = []

    def failing_sink(df, batch_id):
        got = sorted(r.id for r in df.collect())
        seen.append(got)
        if len(seen) == 2:
            raise RuntimeError("injected sink failure")
        df.write.mode("append").parquet(str(tmp_path / "out"))

    cp = str(tmp_path / "cp")
    query = (_stream(spark, nodes_opt, "rp", 100).writeStream.foreachBatch(failing_sink)
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="injected sink failure"):
        query.awaitTermination(240)
    failed_batch = seen[1]
    # The first batch was acked (committed before the second was planned); the failed one is
    # still claimed, not acked.
    with Client([nodes_opt]) as c:
        assert all(c.show(i) is None for i in seen[0])
        assert all(c.show(i) is not None for i in failed_batch)

    # The restart is a new Spark application: another driver process with its own JVM and
    # SparkSession, sharing only the checkpoint and the node. (spark.newSession() does not see
    # Python data sources registered in another session in pyspark 4.3.) It runs the query
    # twice: the replay, then a run that only acks the replayed batch (Spark never commits
    # the last batch of an AvailableNow run).
    env = {**os.environ, "PYTHONPATH": REPO, "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "pipeline", "restart_query.py"),
         nodes_opt, "rp", "100", cp, str(tmp_path / "out"), "2"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    replay_run, last_run = json.loads(done.stdout.strip().splitlines()[-1])
    assert replay_run == [failed_batch]        # exactly the uncommitted batch, replayed
    assert last_run == []                      # nothing delivered again
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.id for r in rows) == sorted(ids)   # no duplicates, none lost
    assert _all_acked(nodes_opt, "rp") == (0, [])
    monitor.close()
    acked = monitor.acked()
    assert set(acked) == set(ids)  # every job acked, and none twice: without the reader's
    # SHOW check, the last run's fresh reader acked the replayed batch a second time.
    assert {i for i, n in acked.items() if n > 1} == set()


def test_retry_shorter_than_a_batch_does_not_duplicate(spark, nodes_opt, tmp_path) -> None:
    import time

    ids = _load(nodes_opt, "ka", 40, retry=1)
    collected: list[str] = []
    stolen: list[str] = []

    def slow_sink(df, batch_id):
        collected.extend(r.id for r in df.collect())
        time.sleep(4)  # four RETRY periods: without WORKING the batch's jobs would be requeued
        # ... and a competing consumer would receive them a second time.
        with Client([nodes_opt]) as other:
            batch = set(r.id for r in df.select("id").collect())
            got = other.get_job("ka", count=100, nohang=True)
            stolen.extend(j.id for j in got if j.id in batch)
            if got:
                other.enqueue(*[j.id for j in got])  # give back what belongs to later batches

    # keepaliveMs is overridable so the test can be shown to fail without the keep-alive.
    keepalive = os.environ.get("TRISQUE_TEST_KEEPALIVE_MS", "200")
    query = (_stream(spark, nodes_opt, "ka", 20, keepaliveMs=keepalive).writeStream
             .foreachBatch(slow_sink).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    assert stolen == []
    assert sorted(collected) == sorted(ids)
