"""Bulk load through the Arrow writer and the snapshot read, against one real node."""

from __future__ import annotations

import pytest

from client.blocking import Client

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_write_10000_rows_then_getjob_returns_them(spark, node, nodes_opt) -> None:
    df = spark.range(10_000).selectExpr("concat('job-', cast(id as string)) as body")
    df.write.format("trisque").option("nodes", nodes_opt).option("queue", "load").mode("append").save()
    with Client([nodes_opt]) as c:
        assert c.qlen("load") == 10_000
        bodies = set()
        while True:
            jobs = c.get_job("load", count=1000, nohang=True)
            if not jobs:
                break
            bodies.update(j.body for j in jobs)
    assert bodies == {f"job-{i}".encode() for i in range(10_000)}


def test_per_row_queue_and_null_body_counted(spark, node, nodes_opt, caplog) -> None:
    df = spark.createDataFrame([("a", "q1"), (None, "q1"), ("b", "q2")], "body string, queue string")
    df.write.format("trisque").option("nodes", nodes_opt).mode("append").save()
    with Client([nodes_opt]) as c:
        assert (c.qlen("q1"), c.qlen("q2")) == (1, 1)


def test_null_body_fails_task_with_onbadrow_fail(spark, node, nodes_opt) -> None:
    df = spark.createDataFrame([("a",), (None,)], "body string")
    with pytest.raises(Exception, match="null body"):
        (df.write.format("trisque").option("nodes", nodes_opt).option("queue", "q")
         .option("onBadRow", "fail").mode("append").save())


def test_oversized_body_is_counted_not_sent(spark, node, nodes_opt) -> None:
    df = spark.createDataFrame([("x" * 100,), ("ok",)], "body string")
    (df.write.format("trisque").option("nodes", nodes_opt).option("queue", "q")
     .option("maxBodyBytes", "10").mode("append").save())
    with Client([nodes_opt]) as c:
        assert [j.body for j in c.get_job("q", count=10, nohang=True)] == [b"ok"]


def test_snapshot_matches_show(spark, node, nodes_opt) -> None:
    with Client([nodes_opt]) as c:
        ids = [c.add_job("snap", f"b{i}".encode(), retry=30, ttl=3600) for i in range(50)]
        ids += [c.add_job("other", b"o", retry=30)]
        c.get_job("snap", count=5)  # some active, some queued
        shown = {i: c.show(i) for i in ids}
    rows = spark.read.format("trisque").option("nodes", nodes_opt).load().collect()
    assert {r.id for r in rows} == set(ids)
    for r in rows:
        info = shown[r.id]
        assert (r.queue, r.state, r.retry, r.nacks, r.additional_deliveries, bytes(r.body)) == (
            info.queue, info.state, info.retry, info.nacks, info.additional_deliveries, info.body)
        # ttl is the time left, as SHOW reports it: it only shrinks between SHOW and the read.
        assert 0 <= info.ttl - r.ttl <= 120
        assert int(r.ctime.timestamp()) == info.ctime // 1_000_000_000


def test_snapshot_pushes_queue_filter_down(spark, node, nodes_opt) -> None:
    with Client([nodes_opt]) as c:
        c.add_job("a", b"1")
        c.add_job("b", b"2")
    df = spark.read.format("trisque").option("nodes", nodes_opt).load().where("queue = 'b'")
    assert [bytes(r.body) for r in df.collect()] == [b"2"]


def test_malformed_option_fails_at_planning_naming_it(spark, nodes_opt) -> None:
    df = spark.range(1).selectExpr("'x' as body")
    with pytest.raises(Exception, match="option 'batchsize'"):
        df.write.format("trisque").option("nodes", nodes_opt).option("batchsize", "lots").mode("append").save()
    with pytest.raises(Exception, match="option 'nodes'"):
        spark.read.format("trisque").option("nodes", "nohostport").load().collect()
    # A stream plans in its query thread: the error ends the query before any batch runs.
    query = spark.readStream.format("trisque").option("nodes", nodes_opt).load() \
        .writeStream.format("console").start()
    try:
        with pytest.raises(Exception, match="option 'queue'"):
            query.awaitTermination(120)
    finally:
        query.stop()


def test_unreachable_node_fails_with_its_address(spark) -> None:
    from tests.support.server import free_port

    port = free_port()
    df = spark.range(1).selectExpr("'x' as body")
    with pytest.raises(Exception, match=f"127.0.0.1:{port}"):
        df.write.format("trisque").option("nodes", f"127.0.0.1:{port}").option("queue", "q").mode("append").save()
