"""Memory of the HTTP API's path and of a three-node cluster's: flat after a warm-up.

These paths are slower per job (an HTTP request each way; replication, federation and the
ack GC between three processes), so fewer jobs go through and the interpreter's allocated
blocks are the sharp measure: a leaked object per job would add as many blocks as jobs.
RSS is held to a few MiB.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.bench import run_benchmark
from cli.bench_load import Spec
from tests.http.conftest import start as start_http_node
from tests.memory.footprint import Footprint, assert_flat, footprint, info_fields
from tests.support.cluster import LocalCluster, local_cluster, wait_until

__all__ = ["local_cluster"]


@pytest.fixture
def http_node() -> Iterator[tuple[Any, str]]:
    srv, base = start_http_node()
    try:
        yield srv, base
    finally:
        srv.stop()


def test_http_publish_receive_delete(http_node: tuple[Any, str]) -> None:
    """POST a message with a Content-Type (kept per job), GET it, DELETE it."""
    srv, base = http_node

    def messages(client: httpx.Client, n: int) -> None:
        for _ in range(n):
            posted = client.post("/messages/hq", content=b"x" * 16,
                                 headers={"Content-Type": "text/plain"})
            assert posted.status_code == 201, posted.text
            got = client.get("/messages/hq")
            assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
            job_id = got.headers["X-Message-Id"]
            assert client.delete(f"/messages/{job_id.replace('/', '%2F')}").status_code == 204

    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.put("/queues/hq", json={}).status_code == 201
        messages(client, 1_000)
        before = footprint(srv.port, srv.proc.pid)
        messages(client, 4_000)
        after = footprint(srv.port, srv.proc.pid)
    assert_flat(before, after, 4_000, rss_slack=2 << 20)


def _cycle(c: LocalCluster, jobs: int) -> None:
    """Producers add REPLICATE 3 jobs on node 0; consumers on node 1 take them (federation:
    NEEDJOBS/YOURJOBS) and acknowledge them (SETACK, GOTACK, DELJOB to every holder)."""
    addr = [("127.0.0.1", c.port(i)) for i in range(3)]
    result = run_benchmark(Spec("cycle", addr, 8, body_size=16, jobs=jobs, duration=120,
                                queues=["memq"], replicate=3, ack="ackjob", producers=4,
                                produce_nodes=addr[:1], consume_nodes=addr[1:2]))
    assert not result["errors"], result["first_error"]
    assert result["consumed"] == jobs, result
    # Every copy collected everywhere: the ack GC has finished.
    wait_until(lambda: all(info_fields(c.port(i), "allocations")["registered_jobs"] == 0
                           for i in range(3)), 30, "every node to collect its copies")


def test_three_nodes_replicate_3_consumed_on_another_node(local_cluster: Any) -> None:
    c: LocalCluster = local_cluster(3)
    ids = [c.myid(i) for i in range(3)]
    for i in (1, 2):
        c.meet(i, 0)
    wait_until(lambda: c.mesh_ok([0, 1, 2], ids), 20, "a mesh of 3")

    def footprints() -> list[Footprint]:
        return [footprint(c.port(i), c.nodes[i].proc.pid, settle_s=0)  # type: ignore[union-attr]
                for i in range(3)]

    _cycle(c, 2_000)
    time.sleep(0.5)
    before = footprints()
    _cycle(c, 8_000)
    time.sleep(0.5)
    after = footprints()
    for b, a in zip(before, after, strict=True):
        assert_flat(b, a, 8_000, rss_slack=4 << 20)
