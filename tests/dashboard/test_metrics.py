"""/metrics on real nodes, parsed with prometheus-client's parser: the numbers are the node's
(queue lengths after ADDJOBs, NACKs, requeues, dead letters, fsyncs, clients, replication
latency and bus messages on a two-node cluster)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.dashboard.conftest import scrape, value
from tests.http.conftest import free_http_port, start
from tests.support.cluster import LocalCluster, wait_until


def test_queue_job_and_log_metrics_are_the_nodes_numbers() -> None:
    srv, base = start(appendfsync="always")
    try:
        call = srv.call
        call("QPOLICY", "CREATE", "dlq")
        call("QPOLICY", "CREATE", "work", "REDRIVE", 2, "dlq")
        for i in range(5):
            call("ADDJOB", "work", f"job {i}", 0)
        call("ADDJOB", "other queue \"quoted\"", "x", 0)
        got = call("GETJOB", "COUNT", 2, "FROM", "work")
        first, second = got[0][1], got[1][1]
        assert call("NACK", first) == 1  # queued again (oldest first): 1 NACK
        assert call("GETJOB", "FROM", "work")[0][1] == first
        assert call("ENQUEUE", second) == 1  # queued again by ENQUEUE: a requeue
        assert call("NACK", first) == 0  # the third delivery would exceed 2: dead-lettered
        holder = socket.create_connection(("127.0.0.1", srv.port))  # one client connected
        try:
            m = scrape(base)
            assert value(m, "trisque_connected_clients") >= 1
        finally:
            holder.close()
        assert value(m, "trisque_queue_length", queue="work") == call("QLEN", "work") == 4
        assert value(m, "trisque_queue_length", queue="dlq") == 1
        assert value(m, "trisque_queue_length", queue='other queue "quoted"') == 1
        # in: 5 ADDJOBs + 1 NACK + 1 ENQUEUE; out: 2 + 1 deliveries.
        assert value(m, "trisque_queue_jobs_in_total", queue="work") == 7
        assert value(m, "trisque_queue_jobs_out_total", queue="work") == 3
        assert value(m, "trisque_queue_nacks_total", queue="work") == 1
        assert value(m, "trisque_queue_requeues_total", queue="work") == 1
        assert value(m, "trisque_queue_dead_lettered_total", queue="work") == 1
        assert value(m, "trisque_jobs") == 6  # 4 in work, 1 in the other queue, 1 dead letter
        assert value(m, "trisque_commands_processed_total") >= 14
        # appendfsync always: every command that logged waited for an fdatasync.
        fsyncs = value(m, "trisque_aof_fsyncs_total")
        assert fsyncs >= 1
        assert value(m, "trisque_aof_fsync_latency_seconds_count") >= fsyncs - 1
        assert value(m, "trisque_aof_fsync_latency_seconds_sum") > 0
        batches = value(m, "trisque_aof_batch_records_count")
        assert batches >= 1 and value(m, "trisque_aof_batch_records_sum") >= batches
        assert value(m, "trisque_aof_size_bytes") > 0 and value(m, "trisque_aof_enabled") == 1
        assert value(m, "trisque_used_memory_bytes") > 0  # the jobs and queues it holds, at least
        assert value(m, "process_resident_memory_bytes") > 1_000_000
        # Pause shows per direction; a fresh scrape sees the change.
        call("PAUSE", "work", "in")
        m = scrape(base)
        assert value(m, "trisque_queue_paused", queue="work", direction="in") == 1
        assert ("trisque_queue_paused", (("direction", "out"), ("queue", "work"))) not in m
        # Prometheus may ask for OpenMetrics.
        r = httpx.get(base + "/metrics", headers={
            "Accept": "application/openmetrics-text; version=1.0.0"})
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.rstrip().endswith("# EOF")
    finally:
        srv.stop()


def test_metrics_need_the_password_like_the_api() -> None:
    srv, base = start(requirepass="s3cret")
    try:
        assert httpx.get(base + "/metrics").status_code == 401
        m = scrape(base, headers={"Authorization": "Bearer s3cret"})
        assert value(m, "trisque_jobs") == 0
        m = scrape(base, auth=("prometheus", "s3cret"))
        assert value(m, "trisque_jobs") == 0
    finally:
        srv.stop()


def test_replication_latency_and_bus_messages_on_two_nodes(tmp_path: Path) -> None:
    http_port = free_http_port()
    cluster = LocalCluster(tmp_path, 2, directives=[{"http_port": http_port}, {}]).start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        cluster.meet(0, 1)
        wait_until(lambda: cluster.info(0)["cluster_reachable_nodes"] == "1", 10,
                   "node 0 reaches node 1")
        for i in range(3):
            reply = cluster.call(0, "ADDJOB", "q", f"replicated {i}", 5000, "REPLICATE", 2)
            assert reply.startswith(b"D-"), reply
        time.sleep(0.2)
        m = scrape(base)
        assert value(m, "trisque_replication_latency_seconds_count") == 3
        # Millisecond resolution (the job core's now_ms): a loopback round trip may take 0 ms.
        total = value(m, "trisque_replication_latency_seconds_sum")
        assert 0 <= total < 15
        assert value(m, "trisque_replication_latency_seconds_bucket", le="+Inf") == 3
        assert value(m, "trisque_replication_latency_seconds_bucket", le="10.0") == 3
        assert value(m, "trisque_bus_messages_sent_total", type="REPLJOB") >= 3
        assert value(m, "trisque_bus_messages_received_total", type="GOTJOB") >= 3
        assert value(m, "trisque_bus_messages_received_total", type="PONG") >= 1
        assert value(m, "trisque_cluster_known_nodes") == 2
        assert value(m, "trisque_cluster_reachable_nodes") == 1
    finally:
        print(cluster.logs())
        cluster.close()
