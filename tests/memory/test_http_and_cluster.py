"""Memory of the HTTP API's path and of a three-node cluster's: flat after a warm-up.

These paths are slower per job (an HTTP request each way; replication, federation and the
ack GC between three processes), so fewer jobs go through and the interpreter's allocated
blocks are the sharp measure: a leaked object per job would add as many blocks as jobs. Here
the libraries' own caches (hypercorn's and trio's per-request tasks, the bus's frames) move
the count by up to about 3,000 blocks either way with no leak, so a run of 5,000 jobs is
held to 4,000 blocks plus one per 20 jobs: a leak of one object per job still shows. RSS is
held to a few MiB.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.http.conftest import start as start_http_node
from tests.memory.footprint import Footprint, assert_flat, footprint, info_fields
from tests.support.cluster import LocalCluster, local_cluster, wait_until

__all__ = ["local_cluster"]

NOISY = 4_000  # the allocated blocks' noise on these paths (see above)


@pytest.fixture
def http_node() -> Iterator[tuple[Any, str]]:
    srv, base = start_http_node()
    try:
        yield srv, base
    finally:
        srv.stop()


@pytest.mark.slow
def test_http_publish_receive_delete(http_node: tuple[Any, str]) -> None:
    """POST a message with a Content-Type (kept per job), GET it, DELETE it; each phase on a
    keep-alive connection of its own, closed before the footprint is read."""
    srv, base = http_node

    def messages(n: int) -> None:
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(n):
                posted = client.post("/messages/hq", content=b"x" * 16,
                                     headers={"Content-Type": "text/plain"})
                assert posted.status_code == 201, posted.text
                got = client.get("/messages/hq")
                assert got.status_code == 200, got.text
                assert got.headers["content-type"].startswith("text/plain")
                job_id = got.headers["X-Message-Id"].replace("/", "%2F")
                assert client.delete(f"/messages/{job_id}").status_code == 204

    assert httpx.put(base + "/queues/hq", json={}).status_code == 201
    messages(1_000)
    before = footprint(srv.port, srv.proc.pid)
    messages(5_000)
    after = footprint(srv.port, srv.proc.pid)
    assert_flat(before, after, 5_000, rss_slack=2 << 20, blocks_noise=NOISY)


def _cycle(c: LocalCluster, jobs: int) -> None:
    """Every job added first, REPLICATE 3 and pipelined 100 at a time on node 0; then all taken
    on node 1 (federation: NEEDJOBS/YOURJOBS) and acknowledged (SETACK, GOTACK, DELJOB to every
    holder). Two phases, so the peak is every job held by every node in each run: RSS follows
    that peak, and a consumer racing the producers would make it vary from run to run."""
    producer = redis.Redis(port=c.port(0), socket_timeout=30)
    consumer = redis.Redis(port=c.port(1), socket_timeout=30)
    try:
        for start in range(0, jobs, 100):
            pipe = producer.pipeline(transaction=False)
            for _ in range(min(100, jobs - start)):
                pipe.execute_command("ADDJOB", "memq", b"x" * 16, 0, "REPLICATE", 3)
            pipe.execute()
        consumed = 0
        deadline = time.monotonic() + 120
        while consumed < jobs and time.monotonic() < deadline:
            got = consumer.execute_command("GETJOB", "TIMEOUT", 1000, "COUNT", 100,
                                           "FROM", "memq")
            if got:
                consumer.execute_command("ACKJOB", *[job[1] for job in got])
                consumed += len(got)
        assert consumed == jobs, f"{consumed} of {jobs} jobs consumed on node 1"
    finally:
        producer.close()
        consumer.close()
    # Every copy collected everywhere: the ack GC has finished.
    wait_until(lambda: all(info_fields(c.port(i), "allocations")["registered_jobs"] == 0
                           for i in range(3)), 30, "every node to collect its copies")


@pytest.mark.slow
def test_three_nodes_replicate_3_consumed_on_another_node(local_cluster: Any) -> None:
    c: LocalCluster = local_cluster(3)
    ids = [c.myid(i) for i in range(3)]
    for i in (1, 2):
        c.meet(i, 0)
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), 20, "a mesh of 3")

    # The same run twice: RSS follows the jobs in flight at the peak, the same both times.
    def footprints() -> list[Footprint]:
        return [footprint(c.port(i), c.nodes[i].proc.pid, settle_s=0)  # type: ignore[union-attr]
                for i in range(3)]

    _cycle(c, 6_000)
    time.sleep(0.5)
    before = footprints()
    _cycle(c, 6_000)
    time.sleep(0.5)
    after = footprints()
    for b, a in zip(before, after, strict=True):
        assert_flat(b, a, 6_000, rss_slack=2 << 20, blocks_noise=NOISY)
