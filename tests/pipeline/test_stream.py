"""The streaming read: AvailableNow into Parquet, ack-on-commit, replay after a failure, and
the WORKING keep-alive, against one real node."""

from __future__ import annotations

import os

import pytest

from protocol.client import Client

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


def test_sink_failure_then_restart_replays_same_rows_acks_nothing_twice(spark, nodes_opt, tmp_path) -> None:
    ids = _load(nodes_opt, "rp", 200, retry=300)
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

    # The restart is a new query on the same session: it gets a fresh driver-side reader
    # process that knows nothing but the checkpoint. (spark.newSession() cannot see Python data
    # sources in pyspark 4.3, and a second JVM would double this suite's start-up time.)
    fresh = spark
    replayed: list[list[str]] = []

    def sink(df, batch_id):
        replayed.append(sorted(r.id for r in df.collect()))
        df.write.mode("append").parquet(str(tmp_path / "out"))

    query = (_stream(fresh, nodes_opt, "rp", 100).writeStream.foreachBatch(sink)
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    assert replayed[0] == failed_batch          # exactly the uncommitted batch, replayed
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.id for r in rows) == sorted(ids)   # no duplicates, none lost
    # A third run only acks the replayed batch (Spark never committed the last one); nothing
    # is delivered again and the broker ends empty.
    query3 = (_stream(fresh, nodes_opt, "rp", 100).writeStream.foreachBatch(sink)
              .option("checkpointLocation", cp).trigger(availableNow=True).start())
    query3.awaitTermination(240)
    assert len(replayed) == 1  # the replay only: AvailableNow saw no queued job (all claimed)
    assert _all_acked(nodes_opt, "rp") == (0, [])


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
