"""The connector's multi-node paths against a real 3-node cluster (real ``trisque-server``
processes joined by the bus, tests/support/cluster.py): the bulk write spread over the cluster
from one seed, a refused write retried on another node, the snapshot deduplicated across
nodes, the stream consuming from every node it is given with ACKs reaching every copy, and a
node killed mid-stream.

Federation (jobs moving to consumers on other nodes) is not on main: the stream reaches a
node's jobs only through that node (see docs/spark.md, "On a cluster")."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import LocalCluster, local_cluster, wait_until

__all__ = ["local_cluster"]

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

JOIN_WITHIN_S = 20.0


def _join(c: LocalCluster) -> list[str]:
    ids = [c.myid(i) for i in range(len(c.nodes))]
    for i in range(1, len(c.nodes)):
        c.meet(i, 0)
    wait_until(lambda: c.mesh_ok(list(range(len(c.nodes))), ids), JOIN_WITHIN_S, "a mesh of 3")
    # Every node's HELLO lists all three with priority 1 (what the connector reads).
    wait_until(lambda: all(sorted(p for *_, p in c.hello(i)[1]) == [1, 1, 1]
                           for i in range(len(c.nodes))), JOIN_WITHIN_S, "HELLO of 3 at priority 1")
    return ids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, list[str]]]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3)
    try:
        c.start()
        yield c, _join(c)
    finally:
        c.close()
        print(c.logs())


def _addr(c: LocalCluster, i: int) -> str:
    return f"127.0.0.1:{c.port(i)}"


def _scan(c: LocalCluster, i: int, queue: str, *states: str) -> list[str]:
    """Every job ID node i holds in ``queue`` (JSCAN, following the cursor), optionally only
    those in ``states``."""
    out, cursor = [], b"0"
    filters = [x for s in states for x in ("STATE", s)]
    while True:
        cursor, ids = c.call(i, "JSCAN", cursor, "COUNT", 1000, "QUEUE", queue, *filters)
        out += [x.decode() for x in ids]
        if cursor in (b"0", "0"):
            return out


def _show(c: LocalCluster, i: int, job_id: str) -> dict[str, Any] | None:
    reply = c.call(i, "SHOW", job_id)
    if reply is None:
        return None
    return {reply[k].decode(): reply[k + 1] for k in range(0, len(reply), 2)}


def _origin(ids: list[str], job_id: str) -> int:
    """The node that created ``job_id`` (its ID embeds the first 8 hex of the node's ID)."""
    return next(i for i, node_id in enumerate(ids) if node_id[:8] == job_id[2:10])


def _write(spark: Any, seed: str, queue: str, rows: int, partitions: int, **opts: str) -> None:
    df = spark.range(0, rows, 1, partitions).selectExpr(f"concat('{queue}-', cast(id as string)) as body")
    w = df.write.format("trisque").option("nodes", seed).option("queue", queue)
    for k, v in opts.items():
        w = w.option(k, v)
    w.mode("append").save()


def _all_jobs(c: LocalCluster, queue: str) -> set[str]:
    return {j for i in range(len(c.nodes)) for j in _scan(c, i, queue)}


@pytest.mark.parametrize("replicate", [1, 3])
def test_bulk_write_from_one_seed_spreads_over_the_cluster(spark, cluster, replicate) -> None:
    c, ids = cluster
    queue = f"spread{replicate}"
    _write(spark, _addr(c, 0), queue, 600, 6, replicate=str(replicate))
    jobs = _all_jobs(c, queue)
    assert len(jobs) == 600
    # 6 tasks over the 3 nodes HELLO lists: each node created the jobs of 2 tasks.
    per_origin = {i: sum(1 for j in jobs if _origin(ids, j) == i) for i in range(3)}
    assert per_origin == {0: 200, 1: 200, 2: 200}
    for j in jobs:
        copies = [i for i in range(3) if _show(c, i, j) is not None]
        assert len(copies) == replicate, (j, copies)
        if replicate == 3:
            info = _show(c, _origin(ids, j), j)
            assert info is not None and len(info["nodes-delivered"]) == 3


def test_refused_write_is_retried_on_another_node(spark, cluster) -> None:
    """Node 1 refuses every ADDJOB to the queue (PAUSE in, on that node only): the two tasks it
    was given have their rows added on another node; nothing is lost or doubled. REPLICATE 1:
    a node whose queue is paused in input takes no copy of a job either (Disque's rule), so a
    replicated write into that queue could not complete anywhere."""
    c, ids = cluster
    assert c.call(1, "PAUSE", "refused", "in") in (b"in", "in")
    try:
        _write(spark, _addr(c, 0), "refused", 300, 3, replicate="1")
    finally:
        c.call(1, "PAUSE", "refused", "none")
    jobs = _all_jobs(c, "refused")
    assert len(jobs) == 300
    origins = {_origin(ids, j) for j in jobs}
    assert 1 not in origins and origins <= {0, 2}


def test_leaving_node_gets_no_write(spark, cluster) -> None:
    """A node that is leaving (HELLO priority 100) is not given any task; the cluster's other
    nodes take them all."""
    c, ids = cluster
    assert c.call(2, "CLUSTER", "LEAVING", "yes") == b"OK"
    try:
        wait_until(lambda: dict((i, p) for i, _, _, p in c.hello(0)[1])[ids[2]] == 100,
                   10, "node0's HELLO shows node2 leaving")
        _write(spark, _addr(c, 0), "leaving", 300, 3, replicate="2")
    finally:
        assert c.call(2, "CLUSTER", "LEAVING", "no") == b"OK"
        wait_until(lambda: all(sorted(p for *_, p in c.hello(i)[1]) == [1, 1, 1]
                               for i in range(3)), 10, "node2 back at priority 1")
    jobs = _all_jobs(c, "leaving")
    assert len(jobs) == 300
    assert {_origin(ids, j) for j in jobs} == {0, 1}


def test_snapshot_reads_every_node_once_per_job(spark, cluster) -> None:
    c, ids = cluster
    added: dict[str, str] = {}
    for i in range(3):
        for k in range(20):
            body = f"snapA-{i}-{k}"
            added[c.call(i, "ADDJOB", "snapA", body, 0, "REPLICATE", 3).decode()] = body
        for k in range(5):
            added[c.call(i, "ADDJOB", "snapB", f"snapB-{i}-{k}", 0).decode()] = f"snapB-{i}-{k}"
    # Every node holds the 60 replicated jobs: 3 x 60 + 15 copies, 75 distinct jobs.
    assert sum(len(_scan(c, i, "snapA")) for i in range(3)) == 180
    df = spark.read.format("trisque").option("nodes", _addr(c, 0)).load()
    rows = df.where("queue in ('snapA', 'snapB')").collect()
    assert len(rows) == 75
    assert {r.id: bytes(r.body).decode() for r in rows} == added
    only_a = df.where("queue = 'snapA'")
    plan = only_a._jdf.queryExecution().executedPlan().toString()
    rows_a = only_a.collect()
    assert len(rows_a) == 60 and {r.queue for r in rows_a} == {"snapA"}
    # The queue filter was pushed down to the source: Spark keeps only its own isnotnull.
    filters = [line for line in plan.splitlines() if "Filter" in line]
    assert filters and all("snapA" not in line for line in filters), plan


def _memory_rows(spark: Any, name: str) -> list[Any]:
    return spark.sql(f"select id, body from {name}").collect()


def test_stream_consumes_every_node_given_and_acks_every_copy(spark, cluster) -> None:
    c, ids = cluster
    added = set()
    for i in range(3):
        for k in range(30):
            added.add(c.call(i, "ADDJOB", "sq", f"sq-{i}-{k}", 0, "REPLICATE", 3).decode())
    nodes = ",".join(_addr(c, i) for i in range(3))
    query = (spark.readStream.format("trisque").option("nodes", nodes).option("queue", "sq")
             .option("maxJobsPerBatch", "40").load()
             .writeStream.format("memory").queryName("sq_out")
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    rows = _memory_rows(spark, "sq_out")
    assert sorted(r.id for r in rows) == sorted(added)
    # The last batch of an AvailableNow run is acked by its final planning; every ACKJOB went
    # to one node and reached the copies on the other two: nothing left anywhere.
    wait_until(lambda: all(_scan(c, i, "sq") == [] for i in range(3)), 10,
               "no copy of any consumed job on any node")


def test_stream_carries_on_when_a_node_is_killed(spark, local_cluster, tmp_path) -> None:
    """kill -9 of one of the three nodes given while the query runs: the query goes on with the
    other two (at-least-once is kept: see docs/spark.md), consumes what is added on them, and
    every consumed job is acked on the survivors."""
    c = local_cluster(3)
    _join(c)
    first = set()
    for i in range(3):
        for k in range(20):
            first.add(c.call(i, "ADDJOB", "kq", f"kq-a-{i}-{k}", 0, "REPLICATE", 3,
                             "RETRY", 30).decode())
    nodes = ",".join(_addr(c, i) for i in range(3))
    query = (spark.readStream.format("trisque").option("nodes", nodes).option("queue", "kq")
             .option("maxJobsPerBatch", "25").option("keepaliveMs", "200").load()
             .writeStream.format("memory").queryName("kq_out")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: len(_memory_rows(spark, "kq_out")) >= 60, 60, "the first 60 jobs read")
        # A batch claimed from node2 by an earlier run of the query (replayed below).
        replicated = [c.call(2, "ADDJOB", "rp", f"rp-{k}", 0, "REPLICATE", 3, "RETRY", 30).decode()
                      for k in range(3)]
        single = c.call(2, "ADDJOB", "rp", "rp-single", 0, "REPLICATE", 1, "RETRY", 30).decode()
        assert len(c.call(2, "GETJOB", "NOHANG", "COUNT", 10, "FROM", "rp")) == 4
        t0 = time.monotonic()
        c.kill(2)
        second = set()
        for i in range(2):
            for k in range(20):
                second.add(c.call(i, "ADDJOB", "kq", f"kq-b-{i}-{k}", 10_000, "REPLICATE", 2,
                                  "RETRY", 30).decode())
        got, waited = wait_until(
            lambda: {r.id for r in _memory_rows(spark, "kq_out")} >= first | second, 60,
            "the 40 jobs added after the kill read from the two survivors")
        print(f"jobs added on the survivors read {time.monotonic() - t0:.1f} s after the kill")
        assert query.isActive and query.exception() is None
        assert got
        # An idle trigger plans again, which acks the last batch: every consumed job is acked
        # on the survivors (ACKs for jobs node2 had delivered went to another node given).
        # An acked job may stay listed, state "acked", until node2 confirms it (it never will
        # here): no job is left queued or active.
        wait_until(lambda: all(_scan(c, i, "kq", "queued", "active") == [] for i in range(2)),
                   15, "no consumed job left unacked on node0 or node1")
    finally:
        query.stop()
    # The snapshot, unlike the stream, does not skip a dead node: it could miss the jobs only
    # that node holds, so it fails with the node's address.
    with pytest.raises(Exception, match=f"127.0.0.1:{c.port(2)}"):
        spark.read.format("trisque").option("nodes", _addr(c, 0)).load().collect()
    # Spark replays an uncommitted batch by calling partitions(start, end) on a fresh reader.
    # The batch's jobs were delivered by node2, now dead: the replicated ones are re-claimed
    # (WORKING) and their bodies read (SHOW) on another node given; the one whose only copy
    # died fails the replay naming it.
    from pipeline.options import stream_options
    from pipeline.stream import JobVanishedError, TrisqueStreamReader

    def replay(ids: list[str]) -> list[Any]:
        reader = TrisqueStreamReader(stream_options({"nodes": nodes, "queue": "rp"}))
        end = {"seq": 7, "jobs": [[i, "rp", None, _addr(c, 2)] for i in ids]}
        try:
            return [row for part in reader.partitions({"seq": 6, "jobs": []}, end)
                    for row in reader.read(part)]
        finally:
            reader.stop()

    rows = replay(replicated)
    assert sorted((r[0], bytes(r[8])) for r in rows) == sorted(
        (i, f"rp-{k}".encode()) for k, i in enumerate(replicated))
    with pytest.raises(JobVanishedError, match=re.escape(single)):
        replay([single])


def test_stream_fails_naming_every_node_when_none_is_reachable(spark) -> None:
    from tests.support.server import free_port

    ports = [free_port(), free_port()]
    query = (spark.readStream.format("trisque")
             .option("nodes", ",".join(f"127.0.0.1:{p}" for p in ports)).option("queue", "q")
             .load().writeStream.format("memory").queryName("none_out").start())
    try:
        with pytest.raises(Exception, match=f"127.0.0.1:{ports[0]}.*127.0.0.1:{ports[1]}"):
            query.awaitTermination(60)
    finally:
        query.stop()
