"""Bodies kept in the append log on a cluster: a replica stores its copy's body in its own
log, and a body read back from the log travels in REPLJOB and in federation's YOURJOBS."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from protocol.resp import Error
from tests.support.cluster import LocalCluster, wait_until
from tests.system.test_replicated_jobs import JOIN_WITHIN_S, joined, show

pytestmark = pytest.mark.cluster_processes

Factory = Callable[..., LocalCluster]


def _on_disk(c: LocalCluster, i: int) -> int:
    text = c.call(i, "INFO", "persistence").decode()
    return int(text.split("jobs_bodies_on_disk:")[1].split("\r\n")[0])


def _pull(c: LocalCluster, node: int, count: int, what: str) -> list[list[bytes]]:
    """GETJOB NOHANG from queue fq on ``node`` until ``count`` jobs came (federation brings
    them): the GETJOB entries, [queue, id, body]."""
    got: list[list[bytes]] = []

    def pulled() -> bool:
        got.extend(c.call(node, "GETJOB", "NOHANG", "COUNT", 10, "FROM", "fq") or [])
        return len(got) >= count

    wait_until(pulled, JOIN_WITHIN_S, what)
    return got


def test_replicas_keep_bodies_in_their_own_logs_and_federation_carries_them(
        local_cluster: Factory) -> None:
    c, _ids = joined(local_cluster, 3, directives=[{"appendonly": "yes"}] * 3)
    bodies = [os.urandom(900 + k) for k in range(20)]
    added: list[Any] = [c.call(0, "ADDJOB", "rq", body, 0, "REPLICATE", 3) for body in bodies]
    assert all(isinstance(a, bytes) for a in added), added
    wait_until(lambda: all(_on_disk(c, i) == 20 for i in range(3)), JOIN_WITHIN_S,
               "every copy's body in its node's log")
    for i in range(3):
        for job_id, body in zip(added, bodies, strict=True):
            info = show(c, i, job_id.decode())
            assert info is not None and info["body"] == body
    # Node 0 read its bodies from its log to send them; a replica restarted with kill -9
    # reads its own log back.
    c.kill(2)
    c.restart(2)
    assert _on_disk(c, 2) == 20
    assert [show(c, 2, j.decode())["body"] for j in added] == bodies  # type: ignore[index]

    # Federation: a consumer on node 1 of a queue only node 0 holds gets the bodies that node
    # 0 keeps in its log (YOURJOBS carries them).
    fed = [os.urandom(700) for _ in range(5)]
    for body in fed:
        assert isinstance(c.call(0, "ADDJOB", "fq", body, 0, "REPLICATE", 1), bytes)
    assert _on_disk(c, 0) == 25
    got = _pull(c, 1, 5, "the jobs of fq federated to node 1")
    assert sorted(entry[2] for entry in got) == sorted(fed)


def _log_bytes(c: LocalCluster, i: int) -> int:
    text = c.call(i, "INFO", "persistence").decode()
    return int(text.split("log_bytes:")[1].split("\r\n")[0])


def test_a_node_at_maxdisk_takes_no_copy_and_imports_nothing(local_cluster: Factory) -> None:
    """As a node short of memory: no GOTJOB for a REPLJOB (the origin asks another node, or
    the ADDJOB fails), and no job imported from a YOURJOBS (its source keeps it)."""
    c, _ids = joined(local_cluster, 3, directives=[{"appendonly": "yes"}] * 3)
    for i in (1, 2):
        assert c.call(i, "CONFIG", "SET", "maxdisk", str(_log_bytes(c, i) + 500)) == b"OK"
    body = os.urandom(1000)
    refused = c.call(0, "ADDJOB", "rq", body, 1500, "REPLICATE", 2)
    assert isinstance(refused, Error) and refused.startswith("NOREPL Timeout"), refused
    assert c.call(1, "QLEN", "rq") == 0 and c.call(2, "QLEN", "rq") == 0
    assert c.call(1, "INFO", "jobs").decode().split("registered_jobs:")[1].startswith("0")
    # Room again on node 1: the next copy goes there, never to node 2.
    assert c.call(1, "CONFIG", "SET", "maxdisk", "0") == b"OK"
    job_id = c.call(0, "ADDJOB", "rq", body, 5000, "REPLICATE", 2)
    assert isinstance(job_id, bytes), job_id
    assert show(c, 1, job_id.decode()) is not None
    assert show(c, 2, job_id.decode()) is None

    # Federation: node 2, still at maxdisk, imports none of the jobs only node 0 holds; its
    # source keeps them and, with room again, node 2's consumer gets them.
    fed = [c.call(0, "ADDJOB", "fq", os.urandom(700), 0, "REPLICATE", 1, "RETRY", 1)
           for _ in range(3)]
    assert all(isinstance(j, bytes) for j in fed), fed
    for _ in range(10):
        assert not c.call(2, "GETJOB", "NOHANG", "COUNT", 10, "FROM", "fq")
        time.sleep(0.1)
    assert all(show(c, 0, j.decode()) is not None for j in fed)
    assert c.call(2, "CONFIG", "SET", "maxdisk", "0") == b"OK"
    got = _pull(c, 2, 3, "the jobs of fq federated to node 2 once it has room")
    assert sorted(entry[1] for entry in got) == sorted(fed)
